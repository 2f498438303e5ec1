"""Process groups of a layout: which devices talk to which, so communication is priced over
the links those devices actually use.

A group's members are the devices that run its ranks: the rank order is
``schemas.geometry.rank_of``'s and the layout's ``DeviceMap`` places each rank on a device.
The data axis holds the d cp ranks that hold the same weights (``Layout.dense_replicas``):
dense gradients are reduced over it, and a context-parallel group is cp consecutive ranks of it.
Expert-parallel groups are runs of ep consecutive data-axis ranks; expert gradients are
reduced over the replicas holding the same experts. With the experts folded over a stage's d t
ranks (``Layout.folds_experts``) they are runs of ep consecutive ranks of the stage, and the
ranks at the same place of every run hold the same experts (``schemas.geometry``).
"""

from collections.abc import Iterator

from cost_models.comm import Group
from planner.schemas import Layout
from planner.schemas.geometry import (
    ExpertMeshAxis,
    MeshAxis,
    axis_stride,
    expert_axis_stride,
    expert_mesh_shape,
    expert_rank_of,
    mesh_shape,
    rank_of,
)


def device_of(layout: Layout, stage: int, replica: int, shard: int) -> int:
    """The device that runs mesh coordinate (stage, replica, shard)."""
    return layout.device_map.device_of(rank_of(layout, stage, replica, shard))


def _group(layout: Layout, first: int, axis: MeshAxis, size: int) -> Group:
    """The devices of ``size`` ranks from rank ``first`` along ``axis``."""
    return _run(layout, first, size, axis_stride(layout, axis))


def _run(layout: Layout, first: int, size: int, stride: int) -> Group:
    """The devices of ``size`` ranks from rank ``first``, ``stride`` apart. (Ranks by stride, not
    one call per member: a search builds these groups thousands of times.)"""
    ranks = range(first, first + size * stride, stride)
    devices = layout.device_map.devices
    return Group(tuple(devices[r] for r in ranks) if devices else ranks)


def tensor_groups(layout: Layout) -> Iterator[Group]:
    """Every tensor-parallel group."""
    p, d, t = mesh_shape(layout)
    for s in range(p):
        for r in range(d):
            yield _group(layout, rank_of(layout, s, r, 0), MeshAxis.TP, t)


def _stages(layout: Layout, stage: int | None) -> range:
    return range(layout.pipeline_parallel_degree) if stage is None else range(stage, stage + 1)


def data_groups(layout: Layout, stage: int | None = None) -> Iterator[Group]:
    """Every data-axis group (the d cp ranks reducing dense gradients), or those of one stage."""
    for s in _stages(layout, stage):
        for j in range(layout.tensor_parallel_degree):
            yield _group(layout, rank_of(layout, s, 0, j), MeshAxis.DP, layout.dense_replicas)


def context_groups(layout: Layout, stage: int | None = None) -> Iterator[Group]:
    """Every context-parallel group (cp consecutive data-axis ranks sharing sequences), or those
    of one stage."""
    cp, stride = layout.context_parallel_degree, axis_stride(layout, MeshAxis.DP)
    for s in _stages(layout, stage):
        for j in range(layout.tensor_parallel_degree):
            for first in range(0, layout.dense_replicas, cp):
                yield _run(layout, rank_of(layout, s, first, j), cp, stride)


def sharding_groups(layout: Layout, stage: int, size: int) -> Iterator[Group]:
    """Runs of ``size`` consecutive data-axis ranks of ``stage`` (a sharding group or a
    secondary partition: the inner dimension of a (replicate, shard) mesh over the data axis)."""
    for j in range(layout.tensor_parallel_degree):
        for first in range(0, layout.dense_replicas, size):
            yield _group(layout, rank_of(layout, stage, first, j), MeshAxis.DP, size)


def replica_groups(layout: Layout, stage: int, sharding_group_size: int) -> Iterator[Group]:
    """The data-axis ranks of ``stage`` at the same place of every sharding group of
    ``sharding_group_size``: the d cp / g replicas of one shard."""
    d, stride = layout.dense_replicas, axis_stride(layout, MeshAxis.DP)
    for j in range(layout.tensor_parallel_degree):
        for i in range(sharding_group_size):
            yield _run(layout, rank_of(layout, stage, i, j), d // sharding_group_size, sharding_group_size * stride)


def _expert_group(layout: Layout, first: int, axis: ExpertMeshAxis, size: int) -> Group:
    """The devices of ``size`` ranks from rank ``first`` along expert-mesh ``axis``."""
    return _run(layout, first, size, expert_axis_stride(layout, axis))


def expert_groups(layout: Layout) -> Iterator[Group]:
    """Every expert-parallel group (the expert mesh's ep axis, ``schemas.geometry``): ep
    consecutive replicas exchanging tokens, or folded ep consecutive ranks of a stage."""
    p, edp, ep, shards = expert_mesh_shape(layout)
    for s in range(p):
        for j in range(shards):
            for g in range(edp):
                yield _expert_group(layout, expert_rank_of(layout, s, g, 0, j), ExpertMeshAxis.EP, ep)


def expert_data_groups(layout: Layout, stage: int | None = None) -> Iterator[Group]:
    """Ranks that hold the same experts (the expert mesh's edp axis), for expert gradient
    reduction: d / ep replicas, or folded the d t / ep ranks of a stage at the same place of
    every expert-parallel group; of every stage or of ``stage``."""
    _, edp, ep, shards = expert_mesh_shape(layout)
    for s in _stages(layout, stage):
        for j in range(shards):
            for i in range(ep):
                yield _expert_group(layout, expert_rank_of(layout, s, 0, i, j), ExpertMeshAxis.EDP, edp)


def pipeline_groups(layout: Layout) -> Iterator[Group]:
    """Every pipeline group: the p stages of one (replica, shard) coordinate."""
    for r in range(layout.dense_replicas):
        for j in range(layout.tensor_parallel_degree):
            yield _group(layout, rank_of(layout, 0, r, j), MeshAxis.PP, layout.pipeline_parallel_degree)


def stage_boundaries(layout: Layout, *, first_pipeline_only: bool = False) -> Iterator[tuple[int, int]]:
    """(sender, receiver) device pairs between consecutive pipeline stages: of every pipeline, or
    of the first (replica 0, shard 0) only."""
    replicas, shards = (1, 1) if first_pipeline_only else (layout.dense_replicas, layout.tensor_parallel_degree)
    for s in range(layout.pipeline_parallel_degree - 1):
        for r in range(replicas):
            for j in range(shards):
                yield device_of(layout, s, r, j), device_of(layout, s + 1, r, j)
