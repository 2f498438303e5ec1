"""Every collective the runtime calls gets tensors on the compute device, which is what NCCL
needs (it refuses CPU tensors: "No backend type associated with device type cpu").

A CPU machine cannot tell a CPU tensor from one on the compute device, as both are CPU. So the
guard makes the difference visible: while a step (or a checkpoint) runs, torch's default device
is ``meta``, in the main thread and in the threads the runtime starts (the vocabulary split's
passes), so a tensor created without ``device=`` lands on ``meta`` instead of on the trainer's
device; and every torch.distributed collective checks its tensors' device first. A rank that
sees a tensor off the device prints which collective and exits at once (its peers then fail
fast on the closed connection, instead of waiting out gloo's timeout). What the guard cannot
see: a tensor explicitly made on the CPU (``.cpu()``, ``device="cpu"``); the runtime has none
in front of a collective.

Layouts: a plain data-parallel step (the loss all-reduce), the vocabulary split over the
pipeline (its broadcasts of buffers for the stages' activations and gradients), ZeRO-1 under
bf16 with a checkpoint saved and resumed (the packed masters' reduce and broadcast), tensor and
sequence parallelism, experts, ZeRO-3.
"""

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks

from planner.files.models import load_model
from planner.schemas import DType, Layout, VocabularyLayout
from runtime import checkpoint
from runtime.collective_clock import TIMED
from runtime.data import synthetic_batch
from runtime.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]

BATCH, SEQ, SEED = 8, 32, 0
CHECKED = (*TIMED, "send", "recv")
"""The collectives and point-to-point calls whose tensors the guard checks (not ``isend``/``irecv``:
``P2POp`` checks that its op is torch's own function)."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _checked(name: str, collective: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    @functools.wraps(collective)
    def check(*args: Any, **kwargs: Any) -> Any:
        for tensor in _tensors([*args, *kwargs.values()]):
            if tensor.device != device:
                sys.stderr.write(
                    f"dist.{name} was handed a tensor on {tensor.device}; the compute device is {device}\n"
                )
                sys.stderr.flush()
                os._exit(3)  # a forked rank: its peers see the connection close at once
        return collective(*args, **kwargs)

    return check


@contextlib.contextmanager
def on_device_only(device: torch.device) -> Iterator[None]:
    """Exit the rank if a collective in the block gets a tensor off ``device`` (module docstring)."""
    originals = {name: getattr(dist, name) for name in CHECKED if hasattr(dist, name)}
    run = threading.Thread.run

    def run_off_default(thread: threading.Thread) -> None:
        torch.set_default_device("meta")  # thread-local: each new thread sets its own
        run(thread)

    for name, collective in originals.items():
        setattr(dist, name, _checked(name, collective, device))
    threading.Thread.run = run_off_default  # type: ignore[method-assign,assignment]
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)
        threading.Thread.run = run  # type: ignore[method-assign]
        for name, collective in originals.items():
            setattr(dist, name, collective)


LAYOUTS: list[tuple[str, dict[str, Any], DType]] = [
    ("tiny-gpt", dict(data_parallel_degree=2), DType.FP32),
    ("tiny-gpt", dict(pipeline_parallel_degree=2, vocabulary_layout=VocabularyLayout.VOCAB_1), DType.FP32),
    ("tiny-gpt", dict(data_parallel_degree=2, zero_stage=1), DType.BF16),
    ("tiny-gpt", dict(tensor_parallel_degree=2, sequence_parallel=True), DType.BF16),
    ("tiny-moe", dict(data_parallel_degree=2, expert_parallel_degree=2), DType.BF16),
    ("tiny-gpt", dict(data_parallel_degree=2, zero_stage=3), DType.BF16),
]


def _trainer(model_name: str, kw: dict[str, Any], dtype: DType) -> Trainer:
    shape = {"data_parallel_degree": 1, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1}
    layout = Layout(**{**shape, "micro_batch_size": 2, **kw})
    model = load_model(model_name)
    return Trainer(
        model,
        layout,
        global_batch_size=BATCH,
        seed=SEED,
        optimizer="adamw",
        lr=1e-3,
        device=torch.device("cpu"),
        dtype=dtype,
    )


def train_guarded(workdir: str) -> list[list[float]]:
    """Two guarded steps of each layout (runs on every rank); ZeRO-1 also saves and resumes."""
    cpu = torch.device("cpu")
    results = []
    for i, (model_name, kw, dtype) in enumerate(LAYOUTS):
        trainer = _trainer(model_name, kw, dtype)
        losses = []
        for step in range(2):
            inputs, targets = synthetic_batch(trainer.model.vocab_size, BATCH, SEQ, step=step, seed=SEED)
            with on_device_only(cpu):
                losses.append(trainer.step(inputs, targets))
        if kw.get("zero_stage") == 1:
            directory = Path(workdir) / f"checkpoints-{i}"
            with on_device_only(cpu):
                checkpoint.save(trainer, directory, 2, plan_sha256="p")
            resumed = _trainer(model_name, kw, dtype)
            with on_device_only(cpu):
                checkpoint.resume(resumed, directory, plan_sha256="p")
        results.append(losses)
    return results


def test_every_collective_gets_tensors_on_the_compute_device(tmp_path: Path) -> None:
    results = run_ranks(2, train_guarded, str(tmp_path), workdir=tmp_path)
    for (model_name, kw, _), losses in zip(LAYOUTS, results, strict=True):
        assert all(torch.isfinite(torch.tensor(losses))), f"{model_name} {kw}: losses {losses}"
