"""Compose memory and time into an Estimate of one layout: the cost models' entry point.

Step time on the critical path (Narayanan et al. SC21, sec. 2.2 and 3):
- m micro-batches through the slowest stage: compute, recompute, tensor/expert-parallel comm;
- pipeline bubble: (p - 1) / v of one micro-batch on the slowest stage;
- pipeline point-to-point: an activation forward and a gradient backward per micro-batch and
  model chunk, and 2 (p - 1) more while the pipeline fills and drains, over the boundary links;
  under tensor parallelism each rank sends its 1/t slice (Megatron-LM's scatter/gather); where
  the profile timed a tiny schedule's slot, what it took beyond its two transfers (the
  schedule's bookkeeping) is added once per slot of the critical path (``micro_batch_slots``);
- data parallel: gradients are reduced in training precision (2 bytes per parameter in mixed
  precision, ZeRO paper's 2 psi), bucket by bucket during the last micro-batch's backward, so
  only what exceeds that backward is exposed. ZeRO-1 reduce-scatters the accumulated gradients
  once and all-gathers the updated parameters (the same volume). ZeRO-2 keeps no full gradient,
  so it reduce-scatters every micro-batch's gradients during that micro-batch's backward (as
  DeepSpeed stage 2 and FSDP with gradient sync do). ZeRO-3 also gathers parameters for every
  forward and backward of every micro-batch (3 psi per micro-batch), prefetched behind compute.
  ZeRO 2-3 shard module by module (``StageParams.units``), one collective per unit each.
  Under a pipeline, ZeRO 2-3 reduce once, after the last backward, and ZeRO-3 gathers for
  every backward and for the first forward, m + 1 times (``pipeline.defers_gradient_reduction``);
  the single reduction has no backward left to hide behind.
  On a CPU device nothing is hidden (``hides_communication``);
- optimizer: Adam reads and writes 28 bytes per parameter of the rank's optimizer shard
  (fp32 weight, two moments, gradient, and the training-precision copy), memory-bound; or at the
  rate the profiler timed on the model's own layer (``compute.measured_optimizer_s``).
On shared cores (CPU ranks that outnumber their node's cores, ``DeviceProfile.core_share`` < 1)
the profiled times are those of every rank computing at once; while pipeline stages wait, the
others get their cores, so the stages' compute, bubble included, takes at least the mean stage's
busy time and at least the critical path at the faster speed (``shared_core_factor``).
A calibrated cluster (schemas.calibration) scales the compute and communication terms and adds
its per-step and per-micro-batch overheads.
Units: seconds, bytes, FLOP.
"""

from collections.abc import Iterator
from dataclasses import replace
from itertools import islice

from cost_models import groups as grp
from cost_models.comm import Group, p2p_time_s
from cost_models.compute import elementwise_time_s, measured_optimizer_s, measured_pipeline_slot_s
from cost_models.layer_work import model_flops_per_sequence
from cost_models.memory import all_stage_memory, stage_params
from cost_models.pipeline import bubble_fraction, defers_gradient_reduction
from cost_models.timing import StageTime, has_uniform_links, slowest_collective_s, stage_times
from cost_models.validate import check_layout
from planner.schemas import (
    Calibration,
    ClusterProfile,
    CollectiveOp,
    DeviceKind,
    Estimate,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    Recompute,
    StageEstimate,
    TimeBreakdown,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.geometry import num_micro_batches, stage_layers

ADAM_BYTES_PER_PARAM = 28
"""Bytes Adam reads and writes per parameter in one step (see module docstring)."""


def _data_parallel_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    stage: int,
    micro_batches: int,
) -> float:
    """Total data-parallel communication of one stage's rank in one step (not yet overlapped)."""
    e = training.dtype.bytes
    held = stage_params(model, layout, stage)
    d, ep = layout.data_parallel_degree, layout.expert_parallel_degree
    layers = stage_layers(model, layout)[stage]
    shares: list[tuple[float, Iterator[Group], int, int]] = [
        (held.dense, grp.data_groups(layout, stage), d, held.units)
    ]
    if held.expert:
        shares.append((held.expert, grp.expert_data_groups(layout, stage), d // ep, max(1, layers)))
    total = 0.0
    for params, groups, size, units in shares:
        if size <= 1:
            continue
        # With uniform links every group of the axis costs the same: price one.
        group_list = list(islice(groups, 1) if has_uniform_links(cluster) else groups)
        nbytes = params * e
        if layout.zero_stage is ZeroStage.NONE:
            total += slowest_collective_s(CollectiveOp.ALL_REDUCE, nbytes, group_list, cluster)
            continue
        if layout.zero_stage is ZeroStage.OPTIMIZER:
            rs = slowest_collective_s(CollectiveOp.REDUCE_SCATTER, nbytes, group_list, cluster)
            ag = slowest_collective_s(CollectiveOp.ALL_GATHER, nbytes, group_list, cluster)
        else:  # sharded module by module: one collective per unit, each with its own latency
            rs = units * slowest_collective_s(CollectiveOp.REDUCE_SCATTER, nbytes / units, group_list, cluster)
            ag = units * slowest_collective_s(CollectiveOp.ALL_GATHER, nbytes / units, group_list, cluster)
        if defers_gradient_reduction(layout):  # one reduction; ZeRO-3 gathers for each backward and once more
            total += rs + (micro_batches + 1 if layout.zero_stage is ZeroStage.PARAMETERS else 1) * ag
        elif layout.zero_stage is ZeroStage.PARAMETERS:
            total += micro_batches * (rs + 2 * ag)
        elif layout.zero_stage is ZeroStage.GRADIENTS:
            total += micro_batches * rs + ag
        else:
            total += rs + ag
    return total


def estimate(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    *,
    memories: tuple[MemoryBreakdown, ...] | None = None,
) -> Estimate:
    """Predict per-rank memory and step time of ``layout``.

    ``memories``, when given, is ``all_stage_memory`` of the same inputs, already computed (a
    search checks memory first and prices time only for layouts that fit).

    Raises:
        InfeasibleConfigError: the layout does not divide the model, the batch or the cluster.
    """
    check_layout(model, training, cluster, layout)
    m = num_micro_batches(training.global_batch_size, layout)
    p, v, t = layout.pipeline_parallel_degree, layout.virtual_stages, layout.tensor_parallel_degree
    times = stage_times(
        model,
        training,
        cluster,
        layout,
        tensor_groups=grp.tensor_groups(layout),
        expert_groups=grp.expert_groups(layout),
    )
    if memories is None:
        memories = all_stage_memory(model, training, cluster, layout)
    layers = stage_layers(model, layout)
    slowest: StageTime = max(times, key=lambda st: st.total_s)

    p2p_s = 0.0
    if p > 1:
        act_bytes = layout.micro_batch_size * training.seq_len * model.hidden_size * training.dtype.bytes / t
        boundaries = grp.stage_boundaries(layout)
        pairs = list(islice(boundaries, 1) if has_uniform_links(cluster) else boundaries)
        hop = max(p2p_time_s(act_bytes, a, b, cluster) for a, b in pairs)
        p2p_s = (2 * m * v + 2 * (p - 1)) * hop
        slot_s = measured_pipeline_slot_s(cluster.device)
        if slot_s is not None:  # the schedule's own cost: the tiny slot beyond its two transfers
            latency_s = max(p2p_time_s(0.0, a, b, cluster) for a, b in pairs)
            p2p_s += micro_batch_slots(layout, m) * max(0.0, slot_s - 2 * latency_s)

    cal = cluster.calibration
    compute_scale, comm_scale = (cal.compute_scale, cal.communication_scale) if cal else (1.0, 1.0)
    dp_exposed, dp_total = 0.0, 0.0
    # On uniform links a stage's reduction depends only on the parameters it holds.
    comm_by_params: dict[tuple[float, float], float] = {}
    for stage, st in enumerate(times):
        held = stage_params(model, layout, stage)
        key = (held.dense, held.expert) if has_uniform_links(cluster) else (float(stage), -1.0)
        if key not in comm_by_params:
            comm_by_params[key] = _data_parallel_s(model, training, cluster, layout, stage, m)
        comm = comm_by_params[key] * comm_scale
        window = compute_scale * {
            ZeroStage.PARAMETERS: m * (st.compute_s + st.recompute_s),
            ZeroStage.GRADIENTS: m * st.backward_s,
        }.get(layout.zero_stage, st.backward_s)
        if not hides_communication(cluster) or (
            defers_gradient_reduction(layout) and layout.zero_stage is ZeroStage.GRADIENTS
        ):
            window = 0.0
        exposed = max(0.0, comm - window)
        if exposed >= dp_exposed:
            dp_exposed, dp_total = exposed, comm

    optimizer_s = 0.0
    for stage in range(p):
        held = stage_params(model, layout, stage)
        shard = layout.data_parallel_degree if layout.zero_stage >= ZeroStage.OPTIMIZER else 1
        expert_shard = max(1, shard // layout.expert_parallel_degree)
        params = held.dense / shard + held.expert / expert_shard
        measured = measured_optimizer_s(cluster.device, model.name, params)
        stage_s = (
            measured if measured is not None else elementwise_time_s(ADAM_BYTES_PER_PARAM * params, cluster.device)
        )
        optimizer_s = max(optimizer_s, stage_s)

    bubble_s = bubble_fraction(layout, m) * m * slowest.total_s
    shared = shared_core_factor(times, m, bubble_s, cluster.device.core_share)
    time = TimeBreakdown(
        compute_s=shared * m * slowest.compute_s,
        recompute_s=shared * m * slowest.recompute_s,
        tensor_parallel_comm_s=shared * m * slowest.tensor_parallel_comm_s,
        expert_parallel_comm_s=shared * m * slowest.expert_parallel_comm_s,
        pipeline_comm_s=p2p_s,
        pipeline_bubble_s=shared * bubble_s,
        data_parallel_comm_s=dp_exposed,
        optimizer_s=optimizer_s,
        data_parallel_comm_overlapped_s=dp_total - dp_exposed,
    )
    if cal is not None:
        time = calibrated_time(time, cal, micro_batch_slots(layout, m))
    step_s = time.step_time_s
    world = layout.world_size
    peak = cluster.device.get_peak_flop_per_s(training.dtype)
    model_flop = training.global_batch_size * model_flops_per_sequence(model, training.seq_len)
    hardware_flop = model_flop * _recompute_flop_ratio(model, training, layout)
    stages = tuple(
        StageEstimate(
            stage=i,
            layers=layers[i],
            holds_embedding=i == 0,
            holds_output_layer=i == p - 1,
            memory=memories[i],
            compute_per_micro_batch_s=times[i].compute_s + times[i].recompute_s,
        )
        for i in range(p)
    )
    return Estimate(
        step_time_s=step_s,
        tokens_per_s=training.tokens_per_step / step_s,
        model_flops_per_step=model_flop,
        hardware_flops_per_step=hardware_flop,
        mfu=model_flop / (step_s * world * peak),
        hfu=hardware_flop / (step_s * world * peak),
        peak_memory_bytes=max(mem.total_bytes for mem in memories),
        memory_capacity_bytes=float(cluster.device.memory_bytes),
        stages=stages,
        time=time,
    )


def shared_core_factor(times: tuple[StageTime, ...], micro_batches: int, bubble_s: float, core_share: float) -> float:
    """What the stages' critical path (m micro-batches on the slowest stage, plus the bubble)
    takes on shared cores, as a fraction of it: 1 when each rank has its own device.

    Times were measured with every rank busy, at ``core_share`` of a core each. A stage that
    waits (in the bubble, or for a slower stage) leaves its cores to the others, which run up
    to 1 / ``core_share`` faster. With ideal sharing the node's cores bound the step from below
    by the mean stage's busy time, and no rank beats its own faster path; this takes that bound.
    Measured on the local 4-rank CPU cluster (2 cores, tiny-gpt, 9 pipelined plans): the
    measured step lay between this bound and the unshared path, nearer the bound when waits are
    long (pp4 with 4 micro-batches: measured 0.39 s, this 0.36 s, unshared 0.69 s) and nearer
    the unshared path with many short slots (pp4, 32 micro-batches: 0.59, 0.44, 0.64 s).
    """
    path_s = micro_batches * max(st.total_s for st in times) + bubble_s
    if core_share >= 1.0 or path_s <= 0:
        return 1.0
    mean_busy_s = micro_batches * sum(st.total_s for st in times) / len(times)
    return min(1.0, max(mean_busy_s, core_share * path_s) / path_s)


def hides_communication(cluster: ClusterProfile) -> bool:
    """Whether data-parallel communication can run behind compute. On GPUs it can: NCCL runs on
    its own streams and copy engines. On a CPU it cannot: gloo's collectives run on the cores that
    compute (measured on the local 4-rank cluster: ZeRO-3 adds its gathers in full, 0.13 s a
    micro-batch of tiny-gpt at dp 4)."""
    return cluster.device.kind is not DeviceKind.CPU


COMPUTE_TERMS = ("compute_s", "recompute_s", "pipeline_bubble_s", "optimizer_s")
"""TimeBreakdown terms a calibration's compute_scale multiplies."""
TENSOR_PARALLEL_TERMS = ("tensor_parallel_comm_s",)
"""TimeBreakdown terms a calibration's tensor_parallel_scale multiplies."""
_SCALED_AFTER_COMPOSITION = ("expert_parallel_comm_s", "pipeline_comm_s")
COMMUNICATION_TERMS = (*_SCALED_AFTER_COMPOSITION, "data_parallel_comm_s")
"""TimeBreakdown terms a calibration's communication_scale multiplies (the data-parallel one
inside ``estimate``, before the overlap with the scaled backward is decided)."""


def micro_batch_slots(layout: Layout, micro_batches: int) -> int:
    """Units of the schedule's critical path: m, or with p > 1 stages m x v chunk steps plus the
    p - 1 that fill the pipeline."""
    p = layout.pipeline_parallel_degree
    return micro_batches if p == 1 else micro_batches * layout.virtual_stages + p - 1


def calibrated_time(time: TimeBreakdown, calibration: Calibration, slots: int) -> TimeBreakdown:
    """The breakdown with the calibration's factors applied (schemas.calibration gives the formula).

    Data-parallel terms are left as they are: ``estimate`` scales them before it decides how much
    of the reduction the (scaled) backward hides.
    """
    scaled = {name: getattr(time, name) * calibration.compute_scale for name in COMPUTE_TERMS}
    scaled |= {name: getattr(time, name) * calibration.tensor_parallel_scale for name in TENSOR_PARALLEL_TERMS}
    scaled |= {name: getattr(time, name) * calibration.communication_scale for name in _SCALED_AFTER_COMPOSITION}
    overhead = calibration.step_overhead_s + calibration.micro_batch_overhead_s * slots
    return replace(time, **scaled, overhead_s=time.overhead_s + overhead)


def _recompute_flop_ratio(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Hardware FLOPs / model FLOPs: full recompute adds one forward of every transformer layer
    (Narayanan et al. eq. 3: 96 vs 72 B s l h^2); selective adds the attention core forward."""
    if layout.recompute is Recompute.NONE:
        return 1.0
    h, s, l = model.hidden_size, training.seq_len, model.num_hidden_layers
    per_seq = model_flops_per_sequence(model, s)
    logits = 3 * 2 * s * h * model.vocab_size
    layer_fwd = (per_seq - logits) / 3
    if layout.recompute is Recompute.FULL:
        return (per_seq + layer_fwd) / per_seq
    attention_fwd = l * 2 * 2 * s * s * model.num_attention_heads * model.head_size
    return (per_seq + attention_fwd) / per_seq
