"""Checkpoints of a run in one layout-independent form: every tensor under its reference name,
saved with ``torch.distributed.checkpoint`` (DCP; each rank writes its part, in parallel), so a
checkpoint taken under one layout resumes under the same one exactly and under another (a
re-plan: data, tensor and pipeline degrees may all change) by DCP's resharding.

The state is keyed by fully-qualified reference names (the runtime's chunks keep the single
process model's names, ``runtime.model``):

- ``model.<name>``: each parameter and buffer as the rank holds it: a DTensor under tensor
  parallelism or ZeRO-2/3 (FSDP2's shards), a plain tensor otherwise. DCP records each DTensor's
  chunks with their offsets in the global tensor and reads, on load, the parts overlapping the
  loading rank's own chunks, whatever the meshes and placements were; a tensor several ranks hold
  (data-parallel replicas, a replicated DTensor) is written once (DCP drops duplicate chunks).
  Under ZeRO-0/1 in bf16/fp16 the value saved is the fp32 master (the low-precision weight is its
  cast), so the form holds the fp32 truth whatever the precision scheme. Experts split over the
  tensor-parallel group by hand (plain tensors, ``runtime.tensor_parallel.split_expert``) are
  saved and loaded as the DTensors their cut amounts to. Experts keep their global index in
  their names, whichever expert-parallel rank holds them.
- ``optim.<name>.<state>``: the optimizer's state of that parameter (AdamW's ``exp_avg``,
  ``exp_avg_sq``, ``step``) laid out as the parameter. A tied output layer's copy on the last
  pipeline stage takes the embedding's name (``tok_emb.weight``): the copies step alike. ZeRO-1
  saves the owner's state only; under ZeRO-1 in mixed precision the masters' slices (and their
  states) are gathered into the parameter's shape on one rank of the sharing group first, a
  1/shards share of them on each (``_mixed``).
- ``rng.rank<r>``: the random generators, restored only on the same plan.
- Under a vocabulary layout split over the pipeline, its shards are blocks of rows of
  ``tok_emb.weight`` and ``head.weight``, the first V mod p a row longer: a DTensor's even chunks
  cannot say so, and they are saved as ShardedTensors (each block with its offset), which DCP
  reshards as it does DTensors.

``meta.json`` records the step, the plan's hash, the model's identity and the global batch size:
resuming refuses another model or another global batch size (the micro-batch count follows
the new layout; the loss is the global batch's mean either way). Resuming rebuilds the trainer
from the plan and seed, creates the optimizer's states (one step with zero gradients at learning
rate 0, which changes no weight), and loads every tensor in place.

Atomic: a checkpoint is written to ``step-NNNNNNNN.partial`` and renamed to ``step-NNNNNNNN``
by rank 0 once every rank has written its part (``torch.distributed.checkpoint.save`` returns
after its metadata is written); ``latest`` names the newest complete one and is replaced
atomically. A job killed while saving leaves a ``.partial`` folder and the previous checkpoint
as ``latest``.
"""

import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from planner.schemas.errors import InfeasibleConfigError
from runtime.checkpoint_layout import Splits, expert_splits, placed, shaped, vocabulary_splits
from runtime.checkpoint_meta import (
    CHECKPOINT_PREFIX,
    LATEST,
    META,
    check_loadable,
    latest,
    layout_json,
    model_sha256,
    prune,
)
from runtime.data_parallel import Optimizer
from runtime.expert_parallel import JointOptimizer
from runtime.optim import DataParallelOptimizer, local
from runtime.trainer import Trainer

TIED_OUTPUT, EMBEDDING = "head.weight", "tok_emb.weight"
VOCABULARY_NAMES = {"embedding": EMBEDDING, "output": TIED_OUTPUT}
"""The reference names of a vocabulary layout's shards (``runtime.vocabulary_parallel``)."""


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a resumed run continues."""

    step: int
    """Steps completed: the next step to run."""
    path: Path
    resharded: bool
    """Taken under another plan: loaded into this layout by DCP's resharding."""


def checkpoint_name(step: int) -> str:
    """The folder of the checkpoint taken after ``step`` steps."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def save(
    trainer: Trainer, directory: Path, step: int, plan_sha256: str, *, keep_last: int = 0, keep: Path | None = None
) -> Path:
    """Save the run's state after ``step`` completed steps (collective: every rank calls it); then,
    with ``keep_last`` above 0, remove the complete checkpoints older than the newest
    ``keep_last``, ``keep`` (the one the run resumed from) aside (``checkpoint_meta.prune``).

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
    state, _ = _state(trainer, saving=True)
    dcp_save(state, checkpoint_id=str(partial))
    dist.barrier()
    if rank == 0:
        meta = {
            "step": step,
            "plan_sha256": plan_sha256,
            "model_name": trainer.model.name,
            "model_sha256": model_sha256(trainer.model),
            "global_batch_size": trainer.global_batch_size,
            "layout": layout_json(trainer.layout),
        }
        (partial / META).write_text(json.dumps(meta) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        pointer = directory / (LATEST + ".tmp")
        pointer.write_text(final.name + "\n")
        os.replace(pointer, directory / LATEST)
        if keep_last > 0:
            prune(directory, keep_last, keep=keep)
    dist.barrier()
    return final


def resume(trainer: Trainer, directory: Path, plan_sha256: str) -> Resumed:
    """Load the newest complete checkpoint of ``directory`` into ``trainer`` (collective), taken
    under this plan or another layout of the same model and global batch size.

    Raises:
        SchemaError: no complete checkpoint there.
        InfeasibleConfigError: it was taken for another model or global batch size, or lacks
            a tensor this layout needs (a checkpoint of an older form).
    """
    meta = check_loadable(directory, trainer.model, trainer.global_batch_size)
    path = latest(directory)
    assert path is not None
    same_plan = meta["plan_sha256"] == plan_sha256
    saved = set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    optimizer_state = any(key.startswith("optim.") for key in saved)
    if optimizer_state:
        _create_optimizer_states(trainer.optimizer)
    state, apply = _state(trainer, saving=False, rng=same_plan, optimizer_state=optimizer_state)
    missing = sorted(key for key in state if key.startswith("model.") and key not in saved)
    if missing:
        raise InfeasibleConfigError(
            f"the checkpoint {str(path)!r} has no {missing[0]!r}, which this layout needs; it was written in "
            "another form: resume it with the planner that wrote it"
        )
    state = {key: value for key, value in state.items() if key in saved}
    dcp_load(state, checkpoint_id=str(path))
    for finish in apply:
        finish(state)
    dist.barrier()
    return Resumed(step=int(meta["step"]), path=path, resharded=not same_plan)


Apply = Callable[[dict[str, Any]], None]
"""Puts what ``dcp.load`` read into the trainer where it was not loaded in place."""


def _state(
    trainer: Trainer, *, saving: bool, rng: bool = True, optimizer_state: bool = True
) -> tuple[dict[str, Any], list[Apply]]:
    """The rank's state by reference name (tensors aliasing the live ones where they can), and
    what puts the loaded values in place afterwards (``optimizer_state``: whether the loaded
    checkpoint has the optimizer's)."""
    names = _parameter_names(trainer)
    splits = expert_splits(trainer) | vocabulary_splits(trainer)
    state: dict[str, Any] = {}
    apply: list[Apply] = []
    masters: dict[int, torch.Tensor] = {}  # fp32 truths of mixed-precision ZeRO-0/1 parameters held here
    mixed: set[int] = set()  # every mixed-precision ZeRO-0/1 parameter: saved by its holder only
    for part in _parts(trainer.optimizer):
        if isinstance(part, DataParallelOptimizer) and part.mixed:
            entries, held, finish = _mixed(part, names, splits, saving=saving, optimizer_state=optimizer_state)
            masters |= {id(p): entries[f"model.{names[id(p)]}"] for p in part.params if id(p) in held}
            mixed |= {id(p) for p in part.params}
            state |= {k: v for k, v in entries.items() if k.startswith("optim.")}
            apply.append(finish)
        else:
            for inner in part.inner if isinstance(part, DataParallelOptimizer) else [part]:
                state |= _optimizer_entries(inner, names, splits)
    for chunk in trainer.chunks:
        for name, tensor in chunk.state_dict(keep_vars=True).items():
            if id(tensor) in mixed and id(tensor) not in masters:
                continue  # its fp32 master is held by another rank
            key = f"model.{names.get(id(tensor), name)}"  # a tied output copy: the embedding's
            state[key] = masters.get(id(tensor), placed(tensor.detach(), tensor, splits))
    if trainer.vocabulary is not None:
        for p in trainer.vocabulary.shards.parameters():
            if id(p) in mixed and id(p) not in masters:
                continue
            state[f"model.{names[id(p)]}"] = masters.get(id(p), placed(p.detach(), p, splits))
    if rng:
        key = f"rng.rank{dist.get_rank()}"
        state[key] = _rng_state()
        apply.append(lambda loaded: _set_rng(loaded[key]) if key in loaded else None)
    return state, apply


def _parameter_names(trainer: Trainer) -> dict[int, str]:
    """Each parameter's reference name, by identity (a tied output copy: the embedding's)."""
    names: dict[int, str] = {}
    for chunk in trainer.chunks:
        for name, p in chunk.named_parameters():
            names[id(p)] = EMBEDDING if name == TIED_OUTPUT and trainer.model.tie_word_embeddings else name
    if trainer.vocabulary is not None:
        for name, p in trainer.vocabulary.shards.named_parameters():
            names[id(p)] = VOCABULARY_NAMES[name]
    return names


def _parts(optimizer: Optimizer | object) -> Iterator[torch.optim.Optimizer | DataParallelOptimizer]:
    """The torch optimizers and data-parallel optimizers inside ``optimizer``, in a fixed order."""
    if isinstance(optimizer, torch.optim.Optimizer | DataParallelOptimizer):
        yield optimizer
    elif isinstance(optimizer, JointOptimizer):
        for part in optimizer.parts:
            yield from _parts(part)


def _optimizer_entries(inner: torch.optim.Optimizer, names: dict[int, str], splits: Splits) -> dict[str, torch.Tensor]:
    """A torch optimizer's state tensors by their parameter's name, laid out as the parameter."""
    return {
        f"optim.{names[id(p)]}.{key}": placed(value, p, splits)
        for group in inner.param_groups
        for p in group["params"]
        for key, value in inner.state.get(p, {}).items()
        if isinstance(value, torch.Tensor)
    }


def _mixed(
    part: DataParallelOptimizer, names: dict[int, str], splits: Splits, *, saving: bool, optimizer_state: bool
) -> tuple[dict[str, torch.Tensor], set[int], Apply]:
    """ZeRO-0/1's fp32 masters and their states in their parameters' shapes, the parameters this
    rank holds them for, and what puts loaded ones in place.

    Without sharding every rank holds every slice. With ZeRO-1 each parameter is held by one
    rank of the sharing group, the owner of its first slice: saving, the owners' slices are
    summed into it (``reduce``; the other ranks' zeros add nothing), one holder's parameters at
    a time; loading, it reads them and sends them to the group (``broadcast``), where each rank
    takes its slices and the masters' casts to the parameters. A rank so keeps 1/shards of the
    masters and moments at once, plus one holder's share in transit.
    """
    holders = _mixed_holders(part)
    kept, buffers = _gathered(holders, saving=saving)
    entries = _mixed_entries(holders, kept, names, splits)
    mine = {id(p) for p in holders.held.get(part.rank, [])}
    return entries, mine, _mixed_loader(holders, buffers, optimizer_state=optimizer_state)


Views = dict[int, dict[str, torch.Tensor]]
"""By parameter id, each field's view into a packed buffer (``_pack``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _MixedHolders:
    """Which rank of the sharing group holds each ZeRO-0/1 parameter's gathered masters (and
    states) in a checkpoint, and the fields each carries."""

    part: DataParallelOptimizer
    fields: list[str]
    """``master``, the optimizer's state kinds (alike on every rank of the group), then ``step`` if any."""
    sharded: bool
    """ZeRO-1 over more than one rank: the masters' slices are spread over the sharing group."""
    holder: dict[int, int]
    """By parameter id: the rank holding it (the owner of its first slice; this rank unsharded)."""
    holders: Sequence[int]
    held: dict[int, list[torch.nn.Parameter]]
    """By holder: the parameters it holds, in order."""

    def source(self, d: int) -> int:
        """Holder ``d``'s global rank."""
        return dist.get_global_rank(self.part.shard_group, d) if self.sharded else dist.get_rank()


def _mixed_holders(part: DataParallelOptimizer) -> _MixedHolders:
    """Who holds which parameter, and its fields; sharded, the state kinds are agreed over the
    sharing group (one collective), as every rank must lay the buffers out alike."""
    pieces = [(piece, inner) for group, inner in zip(part.slices, part.inner, strict=True) for piece in group]
    kinds = sorted({k for piece, inner in pieces for k in inner.state.get(piece.master, {}) if k != "step"})
    sharded = part.shard and part.shards > 1
    if sharded:  # every rank must lay the buffers out alike
        everyone: list[list[str]] = [[] for _ in range(part.shards)]
        dist.all_gather_object(everyone, kinds, group=part.shard_group)
        kinds = sorted({k for ks in everyone for k in ks})
    fields = ["master", *kinds, *(["step"] if kinds else [])]
    holder: dict[int, int] = {}
    for unit, owner in zip(part.units, part.owner, strict=True):
        holder.setdefault(id(unit.param), owner if sharded else part.rank)
    holders = range(part.shards) if sharded else [part.rank]
    held = {d: [p for p in part.params if holder[id(p)] == d] for d in holders}
    return _MixedHolders(part=part, fields=fields, sharded=sharded, holder=holder, holders=holders, held=held)


def _pack(params: list[torch.nn.Parameter], holders: _MixedHolders) -> tuple[torch.Tensor, Views]:
    """One zeroed fp32 buffer for ``params``' fields, and each field's view into it, on the
    optimizer's device (its buckets'): the buffer goes through ``reduce``/``broadcast``, and NCCL
    takes only CUDA tensors."""
    fields = holders.fields
    sizes = [(p, k, 1 if k == "step" else local(p).numel()) for p in params for k in fields]
    buffer = torch.zeros(sum(n for _, _, n in sizes), device=holders.part.buckets.device)
    views: Views = {id(p): {} for p in params}
    offset = 0
    for p, k, n in sizes:
        views[id(p)][k] = buffer[offset : offset + n]
        offset += n
    return buffer, views


def _fill(views: Views, holders: _MixedHolders) -> None:
    """This rank's slices (and, for the parameters it holds, their step) into ``views``."""
    part = holders.part
    for group, inner in zip(part.slices, part.inner, strict=True):
        for piece in group:
            mine = views.get(id(piece.param))
            if mine is None:
                continue
            mine["master"][piece.start : piece.stop] = piece.master
            for k, value in inner.state.get(piece.master, {}).items():
                if k != "step":
                    mine[k][piece.start : piece.stop] = value
                elif holders.holder[id(piece.param)] == part.rank and piece.start == 0:
                    mine[k].copy_(value.detach().reshape(1))


def _gathered(holders: _MixedHolders, *, saving: bool) -> tuple[Views, dict[int, tuple[torch.Tensor, Views]]]:
    """The views of the parameters this rank holds, and (loading) its buffer to load them into.

    Saving, each holder's buffer is packed and filled on every rank and, sharded, summed into the
    holder (one ``reduce`` per holder, in order); loading, only this rank's buffer is packed.
    """
    part = holders.part
    kept: Views = {}
    buffers: dict[int, tuple[torch.Tensor, Views]] = {}
    for d in holders.holders:
        if saving:
            buffer, views = _pack(holders.held[d], holders)
            _fill(views, holders)
            if holders.sharded:
                dist.reduce(buffer, dst=holders.source(d), group=part.shard_group)
            if d == part.rank:
                kept = views
        elif d == part.rank:
            buffers[d] = _pack(holders.held[d], holders)
            kept = buffers[d][1]
    return kept, buffers


def _mixed_entries(
    holders: _MixedHolders, kept: Views, names: dict[int, str], splits: Splits
) -> dict[str, torch.Tensor]:
    """The checkpoint's entries of the parameters this rank holds: masters as ``model.<name>``,
    states as ``optim.<name>.<state>``, in their parameters' shapes."""
    entries: dict[str, torch.Tensor] = {}
    for p in holders.held.get(holders.part.rank, []):
        name = names[id(p)]
        for k in holders.fields:
            key = f"model.{name}" if k == "master" else f"optim.{name}.{k}"
            view = kept[id(p)][k]
            entries[key] = view.reshape(()) if k == "step" else placed(shaped(view, p), p, splits)
    return entries


def _mixed_loader(
    holders: _MixedHolders, buffers: dict[int, tuple[torch.Tensor, Views]], *, optimizer_state: bool
) -> Apply:
    """What puts loaded masters (and states) in place: each holder's buffer, sent to the group
    (sharded: one ``broadcast`` per holder, in order), gives every rank its slices and the
    masters' casts to the parameters."""
    part = holders.part

    def finish(loaded: dict[str, Any]) -> None:
        with torch.no_grad():
            for d in holders.holders:  # the holder's loaded buffer (the entries' storage), to every rank
                buffer, views = buffers[d] if d == part.rank else _pack(holders.held[d], holders)
                if holders.sharded:
                    dist.broadcast(buffer, src=holders.source(d), group=part.shard_group)
                for p in holders.held[d]:
                    local(p.data).view(-1).copy_(views[id(p)]["master"])
                for group, inner in zip(part.slices, part.inner, strict=True):
                    for piece in group:
                        mine = views.get(id(piece.param))
                        if mine is None:
                            continue
                        piece.master.copy_(mine["master"][piece.start : piece.stop])
                        if not optimizer_state:
                            continue
                        for k, value in inner.state.get(piece.master, {}).items():
                            value.copy_(
                                mine[k][piece.start : piece.stop] if k != "step" else mine[k].reshape(value.shape)
                            )

    return finish


def _create_optimizer_states(optimizer: Optimizer) -> None:
    """Give every torch optimizer inside its states, as a first step would, without changing a
    weight: a step with zero gradients at learning rate 0, then the learning rates restored."""
    for part in _parts(optimizer):
        for inner in part.inner if isinstance(part, DataParallelOptimizer) else [part]:
            if inner.state:
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


def _set_rng(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
