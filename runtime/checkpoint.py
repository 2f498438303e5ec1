"""Checkpoints of a run: every rank's model and optimizer state, the step reached and the random
state, saved with ``torch.distributed.checkpoint`` (each rank writes its own part, in parallel),
and resumed on the same plan.

What a rank holds is saved under its own rank's key, as local tensors (a DTensor's local
shard): the chunks' parameters and buffers, the vocabulary shards, every optimizer's state (a
torch optimizer's ``state_dict``; ZeRO-0/1's fp32 master slices beside it), and the random
number generators. Resuming rebuilds the trainer from the same plan and seed, creates the
optimizer states (one step with zero gradients, which changes no weight: the states are then
overwritten), and loads every tensor in place. The same plan places every tensor on the same
rank with the same shape, so the resumed steps compute what the uninterrupted run computes.
Loading into another layout (re-planning) is not this module's yet.

Atomic: a checkpoint is written to ``step-NNNNNNNN.partial`` and renamed to ``step-NNNNNNNN``
by rank 0 once every rank has written its part (``torch.distributed.checkpoint.save`` returns
after its metadata is written); ``latest`` names the newest complete one and is replaced
atomically. A job killed while saving leaves a ``.partial`` folder and the previous checkpoint
as ``latest``.
"""

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor

from planner.schemas.errors import InfeasibleConfigError, SchemaError
from runtime.data_parallel import Optimizer
from runtime.expert_parallel import JointOptimizer
from runtime.optim import DataParallelOptimizer, local
from runtime.trainer import Trainer

LATEST = "latest"
META = "meta.json"


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues."""

    step: int
    """Steps completed: the next step to run."""
    path: Path


def checkpoint_name(step: int) -> str:
    """The folder of the checkpoint taken after ``step`` steps."""
    return f"step-{step:08d}"


def save(trainer: Trainer, directory: Path, step: int, plan_sha256: str) -> Path:
    """Save every rank's state after ``step`` completed steps (collective: every rank calls it).

    Returns:
        The complete checkpoint's folder.
    """
    rank = dist.get_rank()
    final = directory / checkpoint_name(step)
    partial = final.with_name(final.name + ".partial")
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
    dist.barrier()
    dcp_save({f"rank{rank}": _rank_state(trainer)}, checkpoint_id=str(partial))
    dist.barrier()
    if rank == 0:
        (partial / META).write_text(json.dumps({"step": step, "plan_sha256": plan_sha256}) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        pointer = directory / (LATEST + ".tmp")
        pointer.write_text(final.name + "\n")
        os.replace(pointer, directory / LATEST)
    dist.barrier()
    return final


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    pointer = directory / LATEST
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text().strip()
    return path if (path / META).is_file() else None


def resume(trainer: Trainer, directory: Path, plan_sha256: str) -> Resumed:
    """Load the newest complete checkpoint of ``directory`` into ``trainer`` (collective).

    Raises:
        SchemaError: no complete checkpoint there.
        InfeasibleConfigError: it was taken under another plan.
    """
    path = latest(directory)
    if path is None:
        raise SchemaError(f"no complete checkpoint in {str(directory)!r}; run without --resume to start afresh")
    meta = json.loads((path / META).read_text())
    if meta["plan_sha256"] != plan_sha256:
        raise InfeasibleConfigError(
            f"the checkpoint {str(path)!r} was taken under another plan; resume with the plan it was taken under "
            "(re-planning onto another layout is not supported yet)"
        )
    _create_optimizer_states(trainer.optimizer)
    rank = dist.get_rank()
    state = {f"rank{rank}": _rank_state(trainer)}
    dcp_load(state, checkpoint_id=str(path))
    _apply(trainer, state[f"rank{rank}"])
    dist.barrier()
    return Resumed(step=int(meta["step"]), path=path)


def _rank_state(trainer: Trainer) -> dict[str, Any]:
    """What this rank must keep to continue: local tensors that alias the live ones where they can."""
    model = {
        f"chunk{i}.{name}": local(tensor)
        for i, chunk in enumerate(trainer.chunks)
        for name, tensor in chunk.state_dict().items()
    }
    if trainer.vocabulary is not None:
        model |= {f"vocabulary.{i}": local(p.detach()) for i, p in enumerate(trainer.vocabulary.parameters())}
    return {"model": model, "optimizer": _optimizer_state(trainer.optimizer), "rng": _rng_state()}


def _optimizer_state(optimizer: Optimizer | object) -> dict[str, Any]:
    """Each torch optimizer's state dict (DTensor states as their local shards) and ZeRO-0/1's
    fp32 masters, in the order the optimizers nest."""
    state: dict[str, Any] = {}
    for i, inner in enumerate(_optimizers(optimizer)):
        if isinstance(inner, torch.optim.Optimizer):
            sd = inner.state_dict()
            state[f"{i}.state"] = {
                str(k): {n: local(v) if isinstance(v, torch.Tensor) else v for n, v in s.items()}
                for k, s in sd["state"].items()
            }
            state[f"{i}.param_groups"] = sd["param_groups"]
        else:
            state[f"{i}.master"] = inner
    return state


def _optimizers(optimizer: Optimizer | object) -> Iterator[torch.optim.Optimizer | torch.Tensor]:
    """The torch optimizers and fp32 master slices inside ``optimizer``, in a fixed order."""
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
    elif isinstance(optimizer, DataParallelOptimizer):
        yield from optimizer.inner
        yield from (piece.master for group in optimizer.slices for piece in group)
    elif isinstance(optimizer, JointOptimizer):
        for part in optimizer.parts:
            yield from _optimizers(part)


def _create_optimizer_states(optimizer: Optimizer) -> None:
    """Give every torch optimizer inside its states, as a first step would, without changing a
    weight: a step with zero gradients at learning rate 0, then the learning rates restored."""
    for inner in _optimizers(optimizer):
        if not isinstance(inner, torch.optim.Optimizer) or inner.state:
            continue
        rates = [group["lr"] for group in inner.param_groups]
        for group in inner.param_groups:
            group["lr"] = 0.0
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        inner.step()
        for group, lr in zip(inner.param_groups, rates, strict=True):
            group["lr"] = lr
            for p in group["params"]:
                p.grad = None


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _apply(trainer: Trainer, state: dict[str, Any]) -> None:
    """Put what ``dcp.load`` read in place: tensors were loaded into the live ones; the torch
    optimizers take their loaded state dicts (step counts, learning rates); the generators their
    states."""
    saved = state["optimizer"]
    for i, inner in enumerate(_optimizers(trainer.optimizer)):
        if isinstance(inner, torch.optim.Optimizer):
            live = inner.state_dict()
            for key, entry in saved[f"{i}.state"].items():
                for name, value in entry.items():
                    current = live["state"][int(key)][name]
                    if not isinstance(value, torch.Tensor):  # loaded by value, not in place
                        live["state"][int(key)][name] = value
                    elif isinstance(current, DTensor):
                        current.to_local().copy_(value)
            live["param_groups"] = saved[f"{i}.param_groups"]
            inner.load_state_dict(live)
    torch.set_rng_state(state["rng"]["cpu"])
    if "cuda" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"]["cuda"])
