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

Each function returns an ``AxisGroups``: the groups are listed when read, and keyed by what they
depend on (``mesh_key``), so that their pricing is shared by every layout of the same mesh.
"""

from collections.abc import Callable, Iterator, Sequence

from cost_models.comm import AxisGroups
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


def mesh_key(layout: Layout) -> tuple[object, ...]:
    """What a layout's groups depend on: the degrees that shape its meshes (dense, context,
    expert) and its device map; not the micro-batch, recompute, schedule or ZeRO stage."""
    return (
        layout.pipeline_parallel_degree,
        layout.dense_replicas,
        layout.tensor_parallel_degree,
        layout.context_parallel_degree,
        layout.expert_parallel_degree,
        layout.folds_experts,
        layout.device_map,
    )


def device_of(layout: Layout, stage: int, replica: int, shard: int) -> int:
    """The device that runs mesh coordinate (stage, replica, shard)."""
    return layout.device_map.device_of(rank_of(layout, stage, replica, shard))


def _axis(
    layout: Layout, key: tuple[object, ...], starts: Callable[[], Sequence[int]], size: int, stride: int
) -> AxisGroups:
    """Runs of ``size`` ranks ``stride`` apart from each of ``starts``, on the layout's devices."""
    return AxisGroups(
        (key[0], mesh_key(layout), *key[1:]), starts, size=size, stride=stride, devices=layout.device_map.devices
    )


def tensor_groups(layout: Layout) -> AxisGroups:
    """Every tensor-parallel group."""
    p, d, t = mesh_shape(layout)
    starts = lambda: [rank_of(layout, s, r, 0) for s in range(p) for r in range(d)]  # noqa: E731
    return _axis(layout, ("tensor",), starts, t, axis_stride(layout, MeshAxis.TP))


def _stages(layout: Layout, stage: int | None) -> range:
    return range(layout.pipeline_parallel_degree) if stage is None else range(stage, stage + 1)


def data_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Every data-axis group (the d cp ranks reducing dense gradients), or those of one stage."""
    t = layout.tensor_parallel_degree
    starts = lambda: [rank_of(layout, s, 0, j) for s in _stages(layout, stage) for j in range(t)]  # noqa: E731
    return _axis(layout, ("data", stage), starts, layout.dense_replicas, axis_stride(layout, MeshAxis.DP))


def context_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Every context-parallel group (cp consecutive data-axis ranks sharing sequences), or those
    of one stage."""
    cp, t, d = layout.context_parallel_degree, layout.tensor_parallel_degree, layout.dense_replicas
    starts = lambda: [  # noqa: E731
        rank_of(layout, s, first, j) for s in _stages(layout, stage) for j in range(t) for first in range(0, d, cp)
    ]
    return _axis(layout, ("context", stage), starts, cp, axis_stride(layout, MeshAxis.DP))


def sharding_groups(layout: Layout, stage: int, size: int) -> AxisGroups:
    """Runs of ``size`` consecutive data-axis ranks of ``stage`` (a sharding group or a
    secondary partition: the inner dimension of a (replicate, shard) mesh over the data axis)."""
    t, d = layout.tensor_parallel_degree, layout.dense_replicas
    starts = lambda: [rank_of(layout, stage, first, j) for j in range(t) for first in range(0, d, size)]  # noqa: E731
    return _axis(layout, ("sharding", stage, size), starts, size, axis_stride(layout, MeshAxis.DP))


def replica_groups(layout: Layout, stage: int, sharding_group_size: int) -> AxisGroups:
    """The data-axis ranks of ``stage`` at the same place of every sharding group of
    ``sharding_group_size``: the d cp / g replicas of one shard."""
    t, d, g = layout.tensor_parallel_degree, layout.dense_replicas, sharding_group_size
    starts = lambda: [rank_of(layout, stage, i, j) for j in range(t) for i in range(g)]  # noqa: E731
    return _axis(layout, ("replica", stage, g), starts, d // g, g * axis_stride(layout, MeshAxis.DP))


def expert_groups(layout: Layout) -> AxisGroups:
    """Every expert-parallel group (the expert mesh's ep axis, ``schemas.geometry``): ep
    consecutive replicas exchanging tokens, or folded ep consecutive ranks of a stage."""
    p, edp, ep, shards = expert_mesh_shape(layout)
    starts = lambda: [  # noqa: E731
        expert_rank_of(layout, s, g, 0, j) for s in range(p) for j in range(shards) for g in range(edp)
    ]
    return _axis(layout, ("expert",), starts, ep, expert_axis_stride(layout, ExpertMeshAxis.EP))


def expert_data_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Ranks that hold the same experts (the expert mesh's edp axis), for expert gradient
    reduction: d / ep replicas, or folded the d t / ep ranks of a stage at the same place of
    every expert-parallel group; of every stage or of ``stage``."""
    _, edp, ep, shards = expert_mesh_shape(layout)
    starts = lambda: [  # noqa: E731
        expert_rank_of(layout, s, 0, i, j) for s in _stages(layout, stage) for j in range(shards) for i in range(ep)
    ]
    return _axis(layout, ("expert_data", stage), starts, edp, expert_axis_stride(layout, ExpertMeshAxis.EDP))


def pipeline_groups(layout: Layout) -> AxisGroups:
    """Every pipeline group: the p stages of one (replica, shard) coordinate."""
    p, d, t = mesh_shape(layout)
    starts = lambda: [rank_of(layout, 0, r, j) for r in range(d) for j in range(t)]  # noqa: E731
    return _axis(layout, ("pipeline",), starts, p, axis_stride(layout, MeshAxis.PP))


def stage_boundaries(layout: Layout, *, first_pipeline_only: bool = False) -> Iterator[tuple[int, int]]:
    """(sender, receiver) device pairs between consecutive pipeline stages: of every pipeline, or
    of the first (replica 0, shard 0) only."""
    replicas, shards = (1, 1) if first_pipeline_only else (layout.dense_replicas, layout.tensor_parallel_degree)
    for s in range(layout.pipeline_parallel_degree - 1):
        for r in range(replicas):
            for j in range(shards):
                yield device_of(layout, s, r, j), device_of(layout, s + 1, r, j)
