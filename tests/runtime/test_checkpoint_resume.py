"""Checkpoints (``runtime.checkpoint``): a run saved after step k and resumed on the same plan
computes steps k+1.. exactly as the uninterrupted run does (AdamW, whose moments must survive),
under data, pipeline, tensor and sharded data parallelism and mixed precision; a checkpoint left
half-written is never the one resumed."""

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import planner_main, run_ranks

from planner import api
from planner.files.models import load_model
from planner.schemas import DType, Layout, TrainingSpec, VocabularyLayout
from runtime import checkpoint, optim
from runtime.data import synthetic_batch
from runtime.trainer import Trainer

BATCH, SEQ, STEPS, SAVED_AT, SEED, LR = 8, 32, 4, 2, 0, 1e-2
GPT = load_model("tiny-gpt")
LAYOUTS: list[tuple[dict[str, Any], DType]] = [
    (dict(data_parallel_degree=2, pipeline_parallel_degree=2, zero_stage=1), DType.FP32),
    (dict(data_parallel_degree=4, zero_stage=3), DType.FP32),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=True), DType.FP32),
    (dict(data_parallel_degree=4, zero_stage=1), DType.BF16),  # fp32 master slices beside the optimizer
    (  # the vocabulary's row blocks, split over the pipeline
        dict(data_parallel_degree=2, pipeline_parallel_degree=2, vocabulary_layout=VocabularyLayout.VOCAB_2),
        DType.FP32,
    ),
]


def _trainer(kw: dict[str, Any], dtype: DType) -> Trainer:
    layout = Layout(**{"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "micro_batch_size": 2, **kw})
    return Trainer(
        GPT,
        layout,
        global_batch_size=BATCH,
        seed=SEED,
        optimizer="adamw",
        lr=LR,
        device=torch.device("cpu"),
        dtype=dtype,
    )


def _steps(trainer: Trainer, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last):
        inputs, targets = synthetic_batch(GPT.vocab_size, BATCH, SEQ, step=step, seed=SEED)
        losses.append(trainer.step(inputs, targets))
    return losses


def train_save_resume(workdir: str) -> list[dict[str, Any]]:
    """For each layout: the uninterrupted losses, and those of a fresh trainer resumed after SAVED_AT."""
    results = []
    for i, (kw, dtype) in enumerate(LAYOUTS):
        directory = Path(workdir) / f"ckpt{i}"
        whole = _steps(_trainer(kw, dtype), 0, STEPS)
        first = _trainer(kw, dtype)
        _steps(first, 0, SAVED_AT)
        checkpoint.save(first, directory, SAVED_AT, plan_sha256="p")
        if dist.get_rank() == 0:  # a later checkpoint killed half-way: a folder and no pointer to it
            (directory / (checkpoint.checkpoint_name(STEPS) + ".partial")).mkdir()
        dist.barrier()
        resumed = _trainer(kw, dtype)
        at = checkpoint.resume(resumed, directory, plan_sha256="p")
        results.append({"whole": whole, "at": at.step, "after": _steps(resumed, at.step, STEPS)})
    return results


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_resumed_run_continues_exactly_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 masters in slices of 16 Ki elements: a parameter's slices on several ranks (forked ranks inherit it)
    monkeypatch.setattr(optim, "MASTER_SLICE_ELEMENTS", 1 << 14)
    results = run_ranks(4, train_save_resume, str(tmp_path), workdir=tmp_path)
    for (kw, dtype), result in zip(LAYOUTS, results, strict=True):
        assert result["at"] == SAVED_AT
        assert result["after"] == result["whole"][SAVED_AT:], (kw, dtype)
        assert len(set(result["whole"])) == STEPS  # the steps do change the weights
    assert sorted(p.name for p in (tmp_path / "ckpt0").iterdir()) == [
        "latest",
        checkpoint.checkpoint_name(SAVED_AT),
        checkpoint.checkpoint_name(STEPS) + ".partial",
    ]


def test_resume_needs_a_checkpoint_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    plan = api.search("tiny-gpt", "dgx-a100-80g:1", TrainingSpec(global_batch_size=16, seq_len=64))[0]
    api.save_plan(plan, tmp_path / "plan.json")
    code, _, err = planner_main(["run", str(tmp_path / "plan.json"), "--resume"], monkeypatch)
    assert code == 2 and "--checkpoint-dir" in err and len(err.strip().splitlines()) == 1


def test_latest_names_only_a_complete_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "latest").write_text("step-00000002\n")
    assert checkpoint.latest(tmp_path) is None  # no metadata: not complete
    (tmp_path / "step-00000002" / "meta.json").write_text('{"step": 2, "plan_sha256": "p"}')
    assert checkpoint.latest(tmp_path) == tmp_path / "step-00000002"
