"""Collective curves per group shape: all-reduce, all-gather, reduce-scatter and all-to-all over a
sweep of message sizes, for the group shapes plans use.

Shapes: the whole world; halves and pairs of consecutive ranks inside a node (tensor-parallel
groups); ranks strided inside a node; one rank per node (data-parallel groups across nodes).
All groups of a shape run at once, as they do in a job, and the slowest group's median is kept.
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from planner.schemas import CollectiveOp, Placement
from profiler.context import Context
from profiler.topology import RankInfo
from runtime import all_gather_single, reduce_scatter_single


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A partition of the ranks into equal groups of one shape."""

    name: str
    groups: tuple[tuple[int, ...], ...]
    placement: Placement
    members_per_node: int


def group_shapes(infos: list[RankInfo]) -> list[GroupShape]:
    """The shapes worth measuring on this job's topology."""
    world = len(infos)
    hosts = sorted({i.host for i in infos}, key=lambda h: min(i.rank for i in infos if i.host == h))
    by_node = [[i.rank for i in infos if i.host == h] for h in hosts]
    per_node = len(by_node[0])
    shapes = [
        GroupShape(
            "world",
            (tuple(range(world)),),
            Placement.INTRA_NODE if len(hosts) == 1 else Placement.INTER_NODE,
            per_node,
        )
    ]
    for size in sorted({per_node // 2, 2}, reverse=True):
        if 2 <= size < per_node and per_node % size == 0:
            groups = tuple(tuple(node[i : i + size]) for node in by_node for i in range(0, per_node, size))
            shapes.append(GroupShape(f"consecutive {size}", groups, Placement.INTRA_NODE, size))
    if per_node >= 4 and per_node % 2 == 0:
        groups = tuple(tuple(node[j::2]) for node in by_node for j in range(2))
        shapes.append(GroupShape("strided 2", groups, Placement.INTRA_NODE, per_node // 2))
    if len(hosts) > 1 and per_node > 1:
        groups = tuple(tuple(node[j] for node in by_node) for j in range(per_node))
        shapes.append(GroupShape("one per node", groups, Placement.INTER_NODE, 1))
    return shapes


def _run(op: CollectiveOp, group: dist.ProcessGroup, buffers: dict[str, torch.Tensor]) -> None:
    if op is CollectiveOp.ALL_REDUCE:
        dist.all_reduce(buffers["full"], group=group)
    elif op is CollectiveOp.ALL_GATHER:
        all_gather_single(buffers["full"], buffers["shard"], group=group)
    elif op is CollectiveOp.REDUCE_SCATTER:
        reduce_scatter_single(buffers["shard"], buffers["full"], group=group)
    else:
        dist.all_to_all_single(buffers["out"], buffers["full"], group=group)


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One rank's median time of one op at one size in one shape."""

    shape: str
    op: CollectiveOp
    message_bytes: int
    median_s: float
    spread: float


def measure(ctx: Context, infos: list[RankInfo]) -> list[list[CollectiveSample]] | None:
    """Every rank's samples, on rank 0."""
    samples: list[CollectiveSample] = []
    shapes = group_shapes(infos)
    ctx.expect("collectives", len(shapes) * len(ctx.settings.collective_bytes) * len(CollectiveOp))
    for shape in shapes:
        mine, _ = dist.new_subgroups_by_enumeration([list(g) for g in shape.groups])  # type: ignore[no-untyped-call]
        n = len(shape.groups[0])
        for size in ctx.settings.collective_bytes:
            elems = max(n, size // 4 // n * n)  # float32, divisible by the group size
            buffers = {
                "full": torch.zeros(elems, device=ctx.device),
                "shard": torch.zeros(elems // n, device=ctx.device),
                "out": torch.zeros(elems, device=ctx.device),
            }
            for op in CollectiveOp:
                ctx.at("collectives", f"{shape.name}: {op} {size} B")
                timing = ctx.time(partial(_run, op, mine, buffers))
                samples.append(CollectiveSample(shape.name, op, elems * 4, timing.median_s, timing.spread))
    return ctx.gather(samples)
