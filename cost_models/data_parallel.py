"""Data parallelism's step cost: the gradient reduction, or ZeRO's collectives
(``cost_models.sharding``), over the data-parallel groups, and the share of it compute hides.

Gradients are summed (all-reduce, reduce-scatter) in ``Precision.gradient_reduce``: fp32 under
bf16 unless told otherwise, as Megatron-LM (accumulate_allreduce_grads_in_fp32, forced under
bf16), torchtitan's FSDP and the planner's runtime sum them, 4 bytes per parameter; in training
precision under fp16 (the ZeRO paper's 2 psi). Parameters are gathered (all-gather) in
``Precision.parameter_gather``. Both run over the d ranks of a stage's data-parallel group, or in sharding groups and
across their replicas, with ZeRO-3's backward gathers over a secondary partition
(``sharding.dense_group_collectives``, ``groups.sharding_groups``, ``groups.replica_groups``);
expert gradients over the
d / ep ranks that hold the same experts, d t / ep with the experts folded over a stage's d t ranks
(``groups.expert_data_groups``). Which collectives run,
how often and behind which compute is ZeRO's rule (``sharding.step_collectives``). What no
compute can hide (a pipeline's deferred reduction, the first gather and the last bucket or unit's
reduction) is exposed whole; the rest costs what ``overlap.overlapped_comm_cost_s`` says: what
exceeds its window, and at least the slowdown it inflicts on the compute it runs beside. The
step waits for the stage whose reduction is exposed the most. On a CPU device nothing is hidden
(``overlap.hides_communication``).
Units: seconds, bytes.
"""

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from cost_models import groups as grp
from cost_models.comm import AxisGroups, has_uniform_links, priced_groups, slowest_collective_s
from cost_models.memo import HeldMemo
from cost_models.overlap import hides_communication, overlapped_comm_cost_s
from cost_models.params import all_stage_params, stage_params
from cost_models.sharding import (
    GroupCollectives,
    OverlapWindow,
    ShardGroupKind,
    dense_group_collectives,
    step_collectives,
)
from cost_models.timing import StageTime
from planner.schemas import ClusterProfile, CollectiveOp, Layout, ModelSpec, TrainingSpec
from planner.schemas.buffers import GRAD_BUCKET_ELEMENTS
from planner.schemas.geometry import pipeline_schedules, stage_layers


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelTime:
    """Data-parallel communication of one step, on the stage that exposes the most of it."""

    exposed_s: float
    """What compute does not hide: on the step's critical path."""
    total_s: float
    """All of it, hidden or not."""

    @property
    def overlapped_s(self) -> float:
        """What runs behind compute."""
        return self.total_s - self.exposed_s


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCollectiveTime:
    """One rank's data-parallel collectives in one step, before any overlap."""

    total_s: float
    """All of them."""
    unhidden_s: float
    """The part no compute can hide (``sharding.StepCollectives.unhidden_s``)."""


def stage_data_parallel_comm(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    stage: int,
    micro_batches: int,
) -> StageCollectiveTime:
    """Data-parallel communication of one rank of ``stage`` in one step, before any overlap.

    Args:
        model: the model (the stage's parameters, dense and expert).
        training: the precisions gradients are summed and parameters gathered in.
        cluster: links and collective records.
        layout: degrees, ZeRO stage, device map.
        stage: pipeline rank.
        micro_batches: micro-batches per step on one replica (m).

    Returns:
        Seconds of every collective ZeRO runs (``sharding.step_collectives``) over the stage's
        dense parameters and over its experts', each on its slowest group, piece by piece (unit
        or bucket), and of the part of them no compute hides.
    """
    held = stage_params(model, layout, stage)
    layers = stage_layers(model, layout)[stage]
    schedules = pipeline_schedules(layout, training.pipeline_flushes)
    shares: list[tuple[float, AxisGroups, int, int, GroupCollectives]] = [
        (held.dense, *_dense_groups(layout, stage, part), held.units, part)
        for part in dense_group_collectives(layout, micro_batches, schedules)
    ]
    if held.expert:
        edp = layout.expert_data_parallel_degree
        expert = GroupCollectives(
            over=ShardGroupKind.SHARDING,
            collectives=step_collectives(layout, micro_batches, schedules),
        )
        shares.append((held.expert, grp.expert_data_groups(layout, stage), edp, max(1, layers), expert))
    total_s, unhidden_s = 0.0, 0.0
    for params, groups, size, units, part in shares:
        plan = part.collectives
        if size <= 1 or not plan.ops:
            continue
        group_list = priced_groups(groups, cluster, rank_order=layout.device_map.is_identity)
        pieces = units if plan.unit_by_unit else max(1, math.ceil(params / GRAD_BUCKET_ELEMENTS))
        piece_elements = params * part.byte_share / pieces
        piece_s: dict[CollectiveOp, float] = {
            op: slowest_collective_s(op, piece_elements * element_bytes(op, training), group_list, cluster)
            for op in plan.ops
        }
        run_s = {op: pieces * s for op, s in piece_s.items()}
        total_s += plan.time_s(run_s, micro_batches)
        unhidden_s += plan.unhidden_s(run_s, piece_s, micro_batches)
    return StageCollectiveTime(total_s=total_s, unhidden_s=unhidden_s)


def element_bytes(op: CollectiveOp, training: TrainingSpec) -> int:
    """Bytes of one element of a data-parallel collective ``op``: a gathered parameter's in
    ``Precision.parameter_gather``, a summed gradient's in ``Precision.gradient_reduce`` (module
    docstring)."""
    precision = training.precision
    return precision.parameter_gather.bytes if op is CollectiveOp.ALL_GATHER else precision.gradient_reduce.bytes


def _dense_groups(layout: Layout, stage: int, part: GroupCollectives) -> tuple[AxisGroups, int]:
    """The groups of ``stage`` that ``part`` runs over, and their size."""
    d, g = layout.dense_replicas, layout.shard_degree  # the data axis: d cp ranks hold the same weights
    if part.over is ShardGroupKind.REPLICAS:
        return grp.replica_groups(layout, stage, g), d // g
    size = layout.gathers_backward_over if part.over is ShardGroupKind.SECONDARY else g
    return grp.sharding_groups(layout, stage, size), size


def overlap_window_s(window: OverlapWindow, stage_time: StageTime, micro_batches: int) -> float:
    """Seconds of compute behind which the data-parallel collectives run, for one stage.

    Args:
        window: which compute (``sharding.step_collectives``).
        stage_time: the stage's times per micro-batch.
        micro_batches: micro-batches per step on one replica (m).

    Returns:
        The last backward, m backwards, m forwards and backwards (recompute included), or 0.
    """
    if window is OverlapWindow.ALL_COMPUTE:
        return micro_batches * (stage_time.compute_s + stage_time.recompute_s)
    if window is OverlapWindow.EVERY_BACKWARD:
        return micro_batches * stage_time.backward_s
    if window is OverlapWindow.LAST_BACKWARD:
        return stage_time.backward_s
    return 0.0


def data_parallel_time(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    times: tuple[StageTime, ...],
    micro_batches: int,
    *,
    compute_scale: float = 1.0,
    communication_scale: float = 1.0,
) -> DataParallelTime:
    """Data-parallel communication of one step: every stage's, less what its window hides, on the
    stage that exposes the most (module docstring).

    A calibration's scales apply here, before the overlap is decided: the scaled reduction against
    the scaled compute (``cost_models.calibration``).

    Args:
        model: the model.
        training: precision.
        cluster: links, collective records, device kind.
        layout: degrees, ZeRO stage, device map.
        times: every stage's times per micro-batch (``timing.stage_times``).
        micro_batches: micro-batches per step on one replica (m).
        compute_scale: factor on the compute that hides the communication.
        communication_scale: factor on the communication.

    Returns:
        The exposed and the total seconds of the stage whose exposed part is the largest (the
        last such stage on ties).
    """
    plan = step_collectives(layout, micro_batches, pipeline_schedules(layout, training.pipeline_flushes))
    hides = hides_communication(cluster)
    exposed_s, total_s = 0.0, 0.0
    for stage_time, comm in zip(times, _stage_comms(model, training, cluster, layout, micro_batches), strict=True):
        comm_s = comm.total_s * communication_scale
        if hides:
            unhidden_s = comm.unhidden_s * communication_scale
            window_s = compute_scale * overlap_window_s(plan.window, stage_time, micro_batches)
            exposed = unhidden_s + overlapped_comm_cost_s(comm_s - unhidden_s, window_s)
        else:
            exposed = comm_s
        if exposed >= exposed_s:
            exposed_s, total_s = exposed, comm_s
    return DataParallelTime(exposed_s=exposed_s, total_s=total_s)


_STAGE_COMM: HeldMemo[StageCollectiveTime] = HeldMemo(limit=16384)
"""``stage_data_parallel_comm`` by what it reads."""


def _stage_comms(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, micro_batches: int
) -> Iterator[StageCollectiveTime]:
    """``stage_data_parallel_comm`` of every stage, in pipeline order, memoized: a stage's
    collectives depend on the parameters it holds, the degrees and ZeRO stage that group and
    shard them, m, and the devices its groups run on, not on the micro-batch size, recompute,
    sequence parallelism or schedule that a search's layouts also vary. Where links are uniform
    and devices in rank order, they do not depend on which stage holds them either where a
    stage's d t ranks fill whole nodes or share one (its groups then cross nodes as every stage's
    do); otherwise the stage and the device map are part of the key."""
    stages = range(layout.pipeline_parallel_degree)
    rank_order = layout.device_map.is_identity and has_uniform_links(cluster)
    stage_ranks, per_node = layout.dense_replicas * layout.tensor_parallel_degree, cluster.devices_per_node
    aligned = rank_order and (stage_ranks % per_node == 0 or per_node % stage_ranks == 0)
    shared = (
        model,
        training.precision,  # what the collectives move: gathered parameters and summed gradients
        training.pipeline_flushes,
        layout.data_parallel_degree,
        layout.context_parallel_degree,
        layout.tensor_parallel_degree,
        layout.pipeline_parallel_degree,
        layout.expert_parallel_degree,
        layout.expert_tensor_parallel_degree,
        layout.zero_stage,
        layout.sharding_group_size,
        layout.secondary_partition_size,
        micro_batches,
        None if rank_order else layout.device_map,
    )
    for stage, params, layers in zip(stages, all_stage_params(model, layout), stage_layers(model, layout), strict=True):
        key = (*shared, None if aligned else stage, params, layers)
        yield _STAGE_COMM.get(
            cluster,
            key,
            functools.partial(stage_data_parallel_comm, model, training, cluster, layout, stage, micro_batches),
        )
