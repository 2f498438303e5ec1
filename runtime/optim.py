"""Optimizers the runtime offers, and the data-parallel optimizer of ZeRO stages 0 and 1.

``DataParallelOptimizer`` averages gradients over the data-parallel group and steps. It reduces
them in the plan's ``TrainingSpec.reduce_dtype`` (fp32 under bf16) through the gradient buckets
of ``planner.schemas.buffers``, allocated once and held for the whole run as PyTorch DDP's
reducer holds its buckets: min(2 x 25 M, gradients) elements, the cost model's data-parallel
buffer (``cost_models.memory``). With ``shard`` (ZeRO-1,
Rajbhandari et al. 2020) each rank keeps optimizer state only for its share and broadcasts
its update. With parameters in bf16/fp16 it keeps an fp32 master copy of its share, in the
optimizer, as mixed-precision Adam does: 2 + 2 bytes per parameter for weights and gradients,
4 + 8 for master and moments, sharded by ZeRO-1; the share is an even one of the masters'
slices, whatever the parameters' sizes, and consecutive (as Megatron-LM's distributed optimizer
splits its flat buffer evenly: by whole parameters, the rank owning a 128k-vocabulary embedding
held several times its share), so a step broadcasts each share's updates as a few runs, not one
view per slice. In fp32 the shares are whole parameters, balanced greedily.

What a step adds on top of those states, and no more: AdamW runs torch's fused kernel where
torch has one for the device (no full-size temporaries; the single-tensor loop makes two of the
largest parameter's size, sqrt(v) and its quotient), and the masters are stepped slice by slice,
``MASTER_SLICE_ELEMENTS`` at a time, so the fp32 copy of the gradients a master steps with
exists for one slice at once (4 MiB), not for every parameter (4 bytes per parameter).

With ``offload_fraction`` (``Layout.optimizer_offload_fraction``) that share of the rank's owned
master slices, the first in order, keep their master and moments in host memory (pinned where
CUDA is): each step copies their gradients' slices down in fp32, steps them with AdamW on the
host's CPUs (torch's fused CPU kernel), and copies the updated masters back into the
parameters, cast to their precision, as Megatron-Core's hybrid device optimizer does by whole
tensors (``cost_models.offload`` prices it).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Final

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from planner.schemas.buffers import grad_bucket_elements
from runtime.torch_compat import all_gather_single, reduce_scatter_single

OPTIMIZERS = ("adamw", "sgd")
MASTER_SLICE_ELEMENTS: Final = 1 << 20
"""Elements of the fp32 master weights stepped at once (module docstring)."""


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """AdamW (no weight decay), fused where torch has the kernel for the parameters' device and
    dtype, else its single-tensor loop (foreach=False: no list-wide temporaries); or plain SGD
    (exact parity checks)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    groups = _kinds(params)
    try:
        return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, fused=True)
    except RuntimeError:  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, foreach=False)


def _kinds(params: list[torch.Tensor]) -> list[dict[str, list[torch.Tensor]]]:
    """``params`` in one group per kind: plain tensors, and DTensors by mesh and placements. A
    fused step runs one kernel per group, and a kernel takes tensors of one kind only (tensor
    parallelism leaves plain and distributed parameters side by side)."""
    kinds: dict[object, list[torch.Tensor]] = {}
    for p in params:
        key = (p.device_mesh, p.placements) if isinstance(p, DTensor) else None
        kinds.setdefault(key, []).append(p)
    return [{"params": group} for group in kinds.values()] or [{"params": []}]


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor behind a DTensor (the tensor itself otherwise)."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """The rank's gradient laid out as its parameter (a replicated parameter's gradient can be a
    pending partial sum under sequence parallelism; it is reduced first)."""
    g = p.grad
    if g is None:
        return None
    if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
        g = g.redistribute(p.device_mesh, p.placements)
        p.grad = g
    return local(g)


def flat_apply(tensors: list[torch.Tensor], collective: Callable[[torch.Tensor], object]) -> None:
    """Run one collective on the concatenation of ``tensors`` and copy the result back."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    collective(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def _broadcast(flat: torch.Tensor, *, src: int, group: dist.ProcessGroup) -> None:
    dist.broadcast(flat, src=src, group=group)


class DataParallelOptimizer:
    """ZeRO-0 (``shard=False``) or ZeRO-1 (``shard=True``) over ``group``, any parameter precision."""

    def __init__(
        self,
        name: str,
        params: list[torch.nn.Parameter],
        lr: float,
        group: dist.ProcessGroup,
        *,
        shard: bool,
        reduce_dtype: torch.dtype,
        grad_divisor: int | None = None,
        shard_group: dist.ProcessGroup | None = None,
        replica_group: dist.ProcessGroup | None = None,
        offload_fraction: float = 0.0,
        host: torch.device | None = None,
    ) -> None:
        """``reduce_dtype``: the precision the gradients are summed in (the buckets'), whatever
        theirs. ``grad_divisor``: what the gradients' sum over ``group`` is divided by (default the
        group's size: their mean); experts' sums over their expert-data-parallel group are divided
        by the whole data-parallel degree (``runtime.expert_parallel``). ``shard_group``: with
        ``shard``, the ranks of ``group`` that share the state out (ZeRO-1 in sharding groups,
        ``Layout.sharding_group_size``: the other groups hold the same shares and, with the same
        averaged gradients, step them alike); default ``group``. ``replica_group``: with
        ``shard_group``, the ranks of ``group`` at this rank's place in the other sharding groups;
        each bucket is then summed as the cost model prices ZeRO in groups
        (``cost_models.sharding.dense_group_collectives``): reduce-scattered within the sharding
        group, each share all-reduced across the replicas, gathered back, so only 1/g of the bytes
        cross between the groups (an all-reduce over ``group`` sends them all)."""
        self.params, self.group = params, group
        self.size = dist.get_world_size(group)
        self.divisor = self.size if grad_divisor is None else grad_divisor
        self.shard = shard
        self.shard_group = group if shard_group is None else shard_group
        self.shards, self.rank = dist.get_world_size(self.shard_group), dist.get_rank(self.shard_group)
        self.replica_group = replica_group if shard and shard_group is not None else None
        self.mixed = any(p.dtype != torch.float32 for p in params)
        # What ZeRO-1 shares out: with mixed precision the masters' slices (so every rank owns
        # an even share, within a slice, as Megatron-LM's distributed optimizer splits its flat
        # buffer evenly), in fp32 the parameters themselves, whole.
        self.units = _pieces(params) if self.mixed else [_Piece(p, 0, local(p).numel()) for p in params]
        parts, sizes = self.shards if shard else 1, [u.stop - u.start for u in self.units]
        self.owner = _contiguous_owners(sizes, parts) if self.mixed else _balanced_owners(sizes, parts)
        self.updates = [_runs([u for u, o in zip(self.units, self.owner, strict=True) if o == d]) for d in range(parts)]
        """By owner: the runs of elements whose update it broadcasts (ZeRO-1), adjacent slices joined."""
        mine = [u for u, o in zip(self.units, self.owner, strict=True) if not shard or o == self.rank]
        reduced = sum(local(p).numel() for p in params) if self.size > 1 else 0
        device = local(params[0]).device if params else None
        elements = int(grad_bucket_elements(reduced))
        if self.replica_group is not None:  # whole shares for the reduce-scatter
            elements = -(-elements // self.shards) * self.shards
        self.buckets = torch.empty(elements, dtype=reduce_dtype, device=device)
        """The reduction buckets, one buffer (empty without data-parallel peers)."""
        if offload_fraction > 0 and not self.mixed:
            raise ValueError("offload_fraction offloads fp32 master weights; the parameters are fp32 and have none")
        offloaded = _offloaded_count(mine, offload_fraction)
        self.host_slices: list[list[_MasterSlice]] = (
            _grouped_masters(mine[:offloaded], host or torch.device("cpu")) if offloaded else []
        )
        """The owned slices whose masters and moments live on the host (``offload_fraction``)."""
        self.slices: list[list[_MasterSlice]] = (
            _grouped_masters(mine[offloaded:]) + self.host_slices if self.mixed else []
        )
        """Mixed precision: the owned slices' fp32 masters, grouped to step together (the host's last)."""
        self.inner = [make_optimizer(name, [piece.master for piece in group], lr) for group in self.slices]
        if not self.mixed and mine:
            self.inner = [make_optimizer(name, [u.param for u in mine], lr)]

    def zero_grad(self) -> None:
        """Drop every gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Average gradients over the group, step the owned parameters, broadcast their updates."""
        grads = [g for g in (local_grad(p) for p in self.params) if g is not None]
        if self.size > 1:
            self._reduce(grads)
        elif self.divisor != 1:
            for g in grads:
                g.div_(self.divisor)
        if not self.mixed:
            for inner in self.inner:
                inner.step()
        for group, inner in zip(self.slices, self.inner if self.mixed else [], strict=True):
            for piece, grad in zip(group, [local_grad(piece.param) for piece in group], strict=True):
                flat = None if grad is None else grad.reshape(-1)[piece.start : piece.stop].float()
                piece.master.grad = None if flat is None else flat.to(piece.master.device)
            inner.step()
            with torch.no_grad():
                for piece in group:
                    local(piece.param.data).view(-1)[piece.start : piece.stop].copy_(piece.master)
                    piece.master.grad = None  # the fp32 gradient lives only for its slice's update
        with torch.no_grad():
            if self.shard and self.shards > 1:
                for owner, runs in enumerate(self.updates):
                    owned = [local(u.param.data).view(-1)[u.start : u.stop] for u in runs]
                    source = dist.get_global_rank(self.shard_group, owner)
                    flat_apply(owned, partial(_broadcast, src=source, group=self.shard_group))

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        """Sum ``grads`` over the group through the buckets, divided by ``divisor``: the
        gradients are packed in order into the buffer; whenever it is full it is all-reduced and
        unpacked (a gradient larger than the buffer goes through in pieces)."""
        pieces: list[tuple[torch.Tensor, int]] = []  # (flat gradient slice, its offset in the buffer)
        used = 0
        for g in grads:
            flat = g.view(-1)
            start = 0
            while start < flat.numel():
                if used == self.buckets.numel():
                    self._flush(pieces, used)
                    pieces, used = [], 0
                n = min(flat.numel() - start, self.buckets.numel() - used)
                self.buckets[used : used + n].copy_(flat[start : start + n])
                pieces.append((flat[start : start + n], used))
                used, start = used + n, start + n
        if used:
            self._flush(pieces, used)

    def _flush(self, pieces: list[tuple[torch.Tensor, int]], used: int) -> None:
        if self.replica_group is None:
            filled = self.buckets[:used]
            dist.all_reduce(filled, group=self.group)
        else:
            filled = self._sum_in_groups(used, self.replica_group)
        filled.div_(self.divisor)
        for piece, offset in pieces:
            piece.copy_(self.buckets[offset : offset + piece.numel()])

    def _sum_in_groups(self, used: int, replicas: dist.ProcessGroup) -> torch.Tensor:
        """Sum the bucket's first ``used`` elements over the group in sharding groups (the
        constructor's ``replica_group``): reduce-scatter within the sharding group (padded with
        zeros to whole shares), all-reduce of this rank's share across the replicas, all-gather
        back. Returns the summed elements, a view of the bucket."""
        whole = self.buckets[: -(-used // self.shards) * self.shards]
        whole[used:].zero_()
        share = torch.empty(whole.numel() // self.shards, dtype=whole.dtype, device=whole.device)
        reduce_scatter_single(share, whole, group=self.shard_group)
        dist.all_reduce(share, group=replicas)
        all_gather_single(whole, share, group=self.shard_group)
        return whole[:used]

    def host_bytes(self) -> tuple[int, int]:
        """Bytes the host holds for the offloaded slices: their fp32 masters, and with AdamW their
        two fp32 moments (once the first step has made them)."""
        elements = sum(piece.master.numel() for group in self.host_slices for piece in group)
        moments = 2 if elements and isinstance(self.inner[0], torch.optim.AdamW) else 0
        return 4 * elements, 4 * moments * elements

    def tracked(self) -> list[torch.optim.Optimizer | torch.Tensor]:
        """What memory tracking must be told of: the torch optimizers inside (their states), the
        fp32 master weights they step and the reduction buckets, which are no module's tensors."""
        inner: list[torch.optim.Optimizer | torch.Tensor] = list(self.inner)
        return inner + [piece.master for group in self.slices for piece in group] + [self.buckets]


@dataclass(frozen=True, slots=True)
class _MasterSlice:
    """fp32 master of elements [start, stop) of a parameter's flattened local tensor."""

    param: torch.nn.Parameter
    start: int
    stop: int
    master: torch.Tensor


@dataclass(frozen=True, slots=True)
class _Piece:
    """Elements [start, stop) of a parameter's flattened local tensor."""

    param: torch.nn.Parameter
    start: int
    stop: int


def _pieces(params: list[torch.nn.Parameter]) -> list[_Piece]:
    """Each parameter of ``params`` cut into slices of at most ``MASTER_SLICE_ELEMENTS`` elements, in order."""
    return [
        _Piece(p, start, min(start + MASTER_SLICE_ELEMENTS, local(p).numel()))
        for p in params
        for start in range(0, local(p).numel(), MASTER_SLICE_ELEMENTS)
    ]


def _balanced_owners(sizes: list[int], parts: int) -> list[int]:
    """The owner of each of ``sizes``: the least loaded of ``parts`` so far, in a fixed order
    every rank agrees on."""
    loads, owners = [0] * parts, []
    for size in sizes:
        owner = loads.index(min(loads))
        owners.append(owner)
        loads[owner] += size
    return owners


def _contiguous_owners(sizes: list[int], parts: int) -> list[int]:
    """The owner of each of ``sizes``, laid end to end: the one of ``parts`` even shares of the
    whole that its middle falls in, so each owner's pieces are consecutive (as Megatron-LM's
    distributed optimizer gives each rank one range of its flat buffer) and its share is within
    one piece of an even one."""
    total, owners, offset = sum(sizes), [], 0
    for size in sizes:
        owners.append(min(parts - 1, (2 * offset + size) * parts // (2 * total)) if total else 0)
        offset += size
    return owners


def _runs(pieces: list[_Piece]) -> list[_Piece]:
    """``pieces`` with each piece that continues the one before it in the same parameter joined to it."""
    runs: list[_Piece] = []
    for piece in pieces:
        last = runs[-1] if runs else None
        if last is not None and last.param is piece.param and last.stop == piece.start:
            runs[-1] = _Piece(piece.param, last.start, piece.stop)
        else:
            runs.append(piece)
    return runs


def _master_slices(params: list[torch.nn.Parameter]) -> list[list[_MasterSlice]]:
    """The fp32 masters of ``params`` cut into slices (``_pieces``), grouped (``_grouped_masters``)."""
    return _grouped_masters(_pieces(params))


def _offloaded_count(pieces: list[_Piece], fraction: float) -> int:
    """How many of ``pieces``, from the first, hold ``fraction`` of their elements (the last one
    counted crosses it: a slice is offloaded whole)."""
    if fraction <= 0:
        return 0
    target, held = fraction * sum(p.stop - p.start for p in pieces), 0
    for count, piece in enumerate(pieces, start=1):
        held += piece.stop - piece.start
        if held >= target:
            return count
    return len(pieces)


def _grouped_masters(pieces: list[_Piece], host: torch.device | None = None) -> list[list[_MasterSlice]]:
    """The fp32 masters of ``pieces``, packed in order into groups of at most
    ``MASTER_SLICE_ELEMENTS`` elements (one optimizer each); on ``host`` where given (pinned
    where CUDA copies from it), else beside their parameters."""
    groups: list[list[_MasterSlice]] = [[]]
    filled = 0
    for piece in pieces:
        size = piece.stop - piece.start
        if filled + size > MASTER_SLICE_ELEMENTS and groups[-1]:
            groups.append([])
            filled = 0
        flat = local(piece.param).detach().reshape(-1)
        part = flat[piece.start : piece.stop]
        if host is None:
            master = part.float().clone()
        else:  # made on the host (pinned where CUDA copies from it), not first beside the parameter
            pinned = torch.cuda.is_available() and flat.device.type == "cuda"
            master = torch.empty(part.numel(), dtype=torch.float32, device=host, pin_memory=pinned).copy_(part)
        groups[-1].append(_MasterSlice(piece.param, piece.start, piece.stop, master))
        filled += size
    return [g for g in groups if g]
