"""Process groups of a layout: which devices talk to which, so communication is priced over
the links those devices actually use.

A group's members are the devices that run its ranks: the rank order is
``schemas.geometry.rank_of``'s and the layout's ``DeviceMap`` places each rank on a device.
Expert-parallel groups are runs of ep consecutive data-parallel replicas; expert gradients are
reduced over the replicas holding the same experts. With the experts folded over a stage's d t
ranks (``Layout.folds_experts``) they are runs of ep consecutive ranks of the stage, and the
ranks at the same place of every run hold the same experts (``schemas.geometry``).
"""

from collections.abc import Iterator

from cost_models.comm import Group
from planner.schemas import Layout
from planner.schemas.geometry import MeshAxis, axis_stride, rank_of


def device_of(layout: Layout, stage: int, replica: int, shard: int) -> int:
    """The device that runs mesh coordinate (stage, replica, shard)."""
    return layout.device_map.device_of(rank_of(layout, stage, replica, shard))


def _group(layout: Layout, first: int, axis: MeshAxis, size: int, step: int = 1) -> Group:
    """The devices of ``size`` ranks from rank ``first`` along ``axis``, every ``step``-th one.
    (Ranks by stride, not one call per member: a search builds these groups thousands of times.)"""
    stride = step * axis_stride(layout, axis)
    ranks = range(first, first + size * stride, stride)
    devices = layout.device_map.devices
    return Group(tuple(devices[r] for r in ranks) if devices else ranks)


def tensor_groups(layout: Layout) -> Iterator[Group]:
    """Every tensor-parallel group."""
    t = layout.tensor_parallel_degree
    for s in range(layout.pipeline_parallel_degree):
        for r in range(layout.data_parallel_degree):
            yield _group(layout, rank_of(layout, s, r, 0), MeshAxis.TP, t)


def _stages(layout: Layout, stage: int | None) -> range:
    return range(layout.pipeline_parallel_degree) if stage is None else range(stage, stage + 1)


def data_groups(layout: Layout, stage: int | None = None) -> Iterator[Group]:
    """Every data-parallel group (dense parameters' gradient reduction), or those of one stage."""
    for s in _stages(layout, stage):
        for j in range(layout.tensor_parallel_degree):
            yield _group(layout, rank_of(layout, s, 0, j), MeshAxis.DP, layout.data_parallel_degree)


def expert_groups(layout: Layout) -> Iterator[Group]:
    """Every expert-parallel group: ep consecutive replicas exchanging tokens, or folded ep
    consecutive ranks of a stage."""
    ep = layout.expert_parallel_degree
    if layout.folds_experts:
        for s in range(layout.pipeline_parallel_degree):
            for g in range(layout.expert_data_parallel_degree):
                yield _group(layout, rank_of(layout, s, 0, 0) + g * ep, MeshAxis.TP, ep)
        return
    for s in range(layout.pipeline_parallel_degree):
        for j in range(layout.tensor_parallel_degree):
            for g in range(layout.data_parallel_degree // ep):
                yield _group(layout, rank_of(layout, s, g * ep, j), MeshAxis.DP, ep)


def expert_data_groups(layout: Layout, stage: int | None = None) -> Iterator[Group]:
    """Replicas that hold the same experts (d / ep of them), for expert gradient reduction; folded,
    the d t / ep ranks of a stage at the same place of every expert-parallel group."""
    ep = layout.expert_parallel_degree
    if layout.folds_experts:
        for s in _stages(layout, stage):
            for i in range(ep):
                yield _group(layout, rank_of(layout, s, 0, 0) + i, MeshAxis.TP, layout.expert_data_parallel_degree, ep)
        return
    for s in _stages(layout, stage):
        for j in range(layout.tensor_parallel_degree):
            for i in range(ep):
                yield _group(layout, rank_of(layout, s, i, j), MeshAxis.DP, layout.data_parallel_degree // ep, ep)


def pipeline_groups(layout: Layout) -> Iterator[Group]:
    """Every pipeline group: the p stages of one (replica, shard) coordinate."""
    for r in range(layout.data_parallel_degree):
        for j in range(layout.tensor_parallel_degree):
            yield _group(layout, rank_of(layout, 0, r, j), MeshAxis.PP, layout.pipeline_parallel_degree)


def stage_boundaries(layout: Layout, *, first_pipeline_only: bool = False) -> Iterator[tuple[int, int]]:
    """(sender, receiver) device pairs between consecutive pipeline stages: of every pipeline, or
    of the first (replica 0, shard 0) only."""
    replicas, shards = (1, 1) if first_pipeline_only else (layout.data_parallel_degree, layout.tensor_parallel_degree)
    for s in range(layout.pipeline_parallel_degree - 1):
        for r in range(replicas):
            for j in range(shards):
                yield device_of(layout, s, r, j), device_of(layout, s + 1, r, j)
