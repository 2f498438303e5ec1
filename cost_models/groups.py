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

from collections.abc import Callable, Sequence

import numpy as np

from cost_models.comm import AxisGroups
from planner.schemas import Layout
from planner.schemas.geometry import (
    MESH_AXES,
    ExpertMeshAxis,
    MeshAxis,
    axis_stride,
    expert_axis_stride,
    expert_mesh_shape,
    mesh_shape,
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


def _axis(
    layout: Layout, key: tuple[object, ...], starts: Callable[[], Sequence[int]], size: int, stride: int
) -> AxisGroups:
    """Runs of ``size`` ranks ``stride`` apart from each of ``starts``, on the layout's devices."""
    return AxisGroups(
        (key[0], mesh_key(layout), *key[1:]), starts, size=size, stride=stride, devices=layout.device_map.devices
    )


def _ranks(first: int, *axes: tuple[int, int]) -> list[int]:
    """``first`` plus index x stride summed over ``axes`` (count, stride), nested outermost
    first: the first ranks of an axis's groups, in the order the groups are listed."""
    ranks = np.array([first], dtype=np.int64)
    for count, stride in axes:
        ranks = (ranks[:, None] + stride * np.arange(count, dtype=np.int64)).ravel()
    first_ranks: list[int] = ranks.tolist()
    return first_ranks


def tensor_groups(layout: Layout) -> AxisGroups:
    """Every tensor-parallel group."""
    p, d, _ = mesh_shape(layout)
    pp, dp, tp = (axis_stride(layout, axis) for axis in MESH_AXES)
    return _axis(layout, ("tensor",), lambda: _ranks(0, (p, pp), (d, dp)), layout.tensor_parallel_degree, tp)


def _stages(layout: Layout, stage: int | None) -> tuple[int, tuple[int, int]]:
    """The first rank of ``stage`` (of stage 0 for None), and its stages as an axis of ``_ranks``."""
    pp = axis_stride(layout, MeshAxis.PP)
    return (0, (layout.pipeline_parallel_degree, pp)) if stage is None else (stage * pp, (1, pp))


def data_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Every data-axis group (the d cp ranks reducing dense gradients), or those of one stage."""
    (first, stages), t = _stages(layout, stage), layout.tensor_parallel_degree
    dp, tp = axis_stride(layout, MeshAxis.DP), axis_stride(layout, MeshAxis.TP)
    return _axis(layout, ("data", stage), lambda: _ranks(first, stages, (t, tp)), layout.dense_replicas, dp)


def context_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Every context-parallel group (cp consecutive data-axis ranks sharing sequences), or those
    of one stage."""
    (first, stages), t = _stages(layout, stage), layout.tensor_parallel_degree
    cp, d = layout.context_parallel_degree, layout.dense_replicas
    dp, tp = axis_stride(layout, MeshAxis.DP), axis_stride(layout, MeshAxis.TP)
    return _axis(layout, ("context", stage), lambda: _ranks(first, stages, (t, tp), (d // cp, cp * dp)), cp, dp)


def sharding_groups(layout: Layout, stage: int, size: int) -> AxisGroups:
    """Runs of ``size`` consecutive data-axis ranks of ``stage`` (a sharding group or a
    secondary partition: the inner dimension of a (replicate, shard) mesh over the data axis)."""
    (first, _), t, d = _stages(layout, stage), layout.tensor_parallel_degree, layout.dense_replicas
    dp, tp = axis_stride(layout, MeshAxis.DP), axis_stride(layout, MeshAxis.TP)
    return _axis(layout, ("sharding", stage, size), lambda: _ranks(first, (t, tp), (d // size, size * dp)), size, dp)


def replica_groups(layout: Layout, stage: int, sharding_group_size: int) -> AxisGroups:
    """The data-axis ranks of ``stage`` at the same place of every sharding group of
    ``sharding_group_size``: the d cp / g replicas of one shard."""
    (first, _), t, d, g = (
        _stages(layout, stage),
        layout.tensor_parallel_degree,
        layout.dense_replicas,
        sharding_group_size,
    )
    dp, tp = axis_stride(layout, MeshAxis.DP), axis_stride(layout, MeshAxis.TP)
    return _axis(layout, ("replica", stage, g), lambda: _ranks(first, (t, tp), (g, dp)), d // g, g * dp)


def expert_groups(layout: Layout) -> AxisGroups:
    """Every expert-parallel group (the expert mesh's ep axis, ``schemas.geometry``): ep
    consecutive replicas exchanging tokens, or folded ep consecutive ranks of a stage."""
    _, edp, ep, shards = expert_mesh_shape(layout)
    (first, stages), edp_stride = _stages(layout, None), expert_axis_stride(layout, ExpertMeshAxis.EDP)
    return _axis(
        layout,
        ("expert",),
        lambda: _ranks(first, stages, (shards, 1), (edp, edp_stride)),
        ep,
        expert_axis_stride(layout, ExpertMeshAxis.EP),
    )


def expert_data_groups(layout: Layout, stage: int | None = None) -> AxisGroups:
    """Ranks that hold the same experts (the expert mesh's edp axis), for expert gradient
    reduction: d / ep replicas, or folded the d t / ep ranks of a stage at the same place of
    every expert-parallel group; of every stage or of ``stage``."""
    _, edp, ep, shards = expert_mesh_shape(layout)
    (first, stages), ep_stride = _stages(layout, stage), expert_axis_stride(layout, ExpertMeshAxis.EP)
    return _axis(
        layout,
        ("expert_data", stage),
        lambda: _ranks(first, stages, (shards, 1), (ep, ep_stride)),
        edp,
        expert_axis_stride(layout, ExpertMeshAxis.EDP),
    )


def pipeline_groups(layout: Layout) -> AxisGroups:
    """Every pipeline group: the p stages of one (replica, shard) coordinate."""
    _, d, t = mesh_shape(layout)
    pp, dp, tp = (axis_stride(layout, axis) for axis in MESH_AXES)
    return _axis(layout, ("pipeline",), lambda: _ranks(0, (d, dp), (t, tp)), layout.pipeline_parallel_degree, pp)
