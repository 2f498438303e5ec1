"""Compose memory and time into an Estimate of one layout: the cost models' entry point.

Step time on the critical path (Narayanan et al. SC21, sec. 2.2 and 3) is the sum of:
- m micro-batches through the slowest stage: compute, recompute, tensor-, expert- and
  context-parallel communication (``cost_models.timing``, ``.tensor_parallel``,
  ``.expert_parallel``, ``.context_parallel``);
- the pipeline's bubble and point-to-point transfers (``cost_models.pipeline``), and the sum of
  a tied embedding's two copies' gradients across the pipeline (``cost_models.vocabulary``);
- the data-parallel communication that compute does not hide (``cost_models.data_parallel``,
  with ZeRO's rules in ``cost_models.sharding``);
- the optimizer step (``cost_models.optimizer``), and the host's part of it where optimizer
  states are offloaded (``cost_models.offload``).
On shared cores the stages' compute and bubble shrink (``cost_models.shared_cores``); a
calibrated cluster scales the terms and adds its overheads (``cost_models.calibration``).
Memory per stage comes from ``cost_models.memory``. Units: seconds, bytes, FLOP.
"""

from dataclasses import dataclass

from cost_models.calibration import calibrated_time
from cost_models.data_parallel import data_parallel_time
from cost_models.expert_parallel import stage_expert_loads
from cost_models.layer_work import hardware_flop_ratio, model_flops_per_sequence
from cost_models.layout_validity import check_layout
from cost_models.memory import all_stage_memory
from cost_models.offload import activation_offload_s, host_memory_per_node_bytes, optimizer_offload_s
from cost_models.optimizer import optimizer_step_s
from cost_models.params import all_stage_params
from cost_models.pipeline import bubble_s, micro_batch_slots, pipeline_comm_s
from cost_models.shared_cores import shared_core_factor
from cost_models.stage_activations import offloaded_activation_bytes
from cost_models.stage_devices import mean_peak_flop_per_s
from cost_models.timing import StageTime, stage_times
from cost_models.vocabulary import tied_embedding_sync_s
from planner.schemas import (
    ClusterProfile,
    Estimate,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    StageEstimate,
    TimeBreakdown,
    TrainingSpec,
)
from planner.schemas.geometry import num_micro_batches, pipeline_schedules, stage_layers
from planner.schemas.routing import RoutingStats
from planner.schemas.stacks import stack_named


def estimate(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    *,
    memories: tuple[MemoryBreakdown, ...] | None = None,
    routing: RoutingStats | None = None,
) -> Estimate:
    """Predict per-rank memory and step time of ``layout`` (module docstring).

    Args:
        model: the model.
        training: global batch, sequence length, precision.
        cluster: the device, links and profiled records; its calibration if any.
        layout: the candidate.
        memories: ``all_stage_memory`` of the same inputs, when already computed (a search
            checks memory first and prices time only for layouts that fit).
        routing: a routing trace's statistics of an MoE model: each MoE layer then costs what
            its busiest rank carries under the layout's placement (``expert_parallel``); None
            assumes uniform routing.

    Returns:
        Memory per stage, the step time's breakdown, throughput, FLOPs and utilization.

    Raises:
        InfeasibleConfigError: the layout does not divide the model, the batch or the cluster.
    """
    check_layout(model, training, cluster, layout)
    return estimate_unchecked(model, training, cluster, layout, memories=memories, routing=routing)


def estimate_unchecked(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    *,
    memories: tuple[MemoryBreakdown, ...] | None = None,
    routing: RoutingStats | None = None,
) -> Estimate:
    """``estimate`` of a layout that ``check_layout`` has already accepted (a search's evaluator
    checks every layout before pricing its memory, and need not check it again)."""
    path = critical_path(model, training, cluster, layout, routing)
    m, times, slowest, bubble, shared = path.micro_batches, path.times, path.slowest, path.bubble_s, path.shared
    if memories is None:
        memories = all_stage_memory(model, training, cluster, layout, routing)
    cal = cluster.calibration
    data_parallel = data_parallel_time(
        model,
        training,
        cluster,
        layout,
        times,
        m,
        compute_scale=cal.compute_scale if cal else 1.0,
        communication_scale=cal.communication_scale if cal else 1.0,
    )
    time = TimeBreakdown(
        compute_s=shared * m * slowest.compute_s,
        recompute_s=shared * m * slowest.recompute_s,
        tensor_parallel_comm_s=shared * m * slowest.tensor_parallel_comm_s,
        expert_parallel_comm_s=shared * m * slowest.expert_parallel_comm_s,
        pipeline_comm_s=pipeline_comm_s(model, training, cluster, layout, m, slowest.compute_s + slowest.recompute_s)
        + m * slowest.vocabulary_comm_s  # every pipeline rank takes part: no core is freed for it
        + tied_embedding_sync_s(model, training, cluster, layout),
        pipeline_bubble_s=shared * bubble,
        data_parallel_comm_s=data_parallel.exposed_s,
        optimizer_s=optimizer_step_s(
            model, cluster, layout, training.kernels, weights_dtype=training.precision.weights
        ),
        data_parallel_comm_overlapped_s=data_parallel.overlapped_s,
        context_parallel_comm_s=shared * m * slowest.context_parallel_comm_s,
        optimizer_offload_s=optimizer_offload_s(
            model,
            cluster,
            layout,
            training.precision,
            micro_batches=m,
            compute_per_micro_batch_s=shared * (slowest.compute_s + slowest.recompute_s),
        ),
        activation_offload_s=activation_offload_s(
            offloaded_activation_bytes(model, training, layout, stage_expert_loads(model, training, layout, routing)[0])
            if layout.activation_offload_layers
            else 0.0,
            cluster,
            layout,
            stack_named(training.stack),
            layers=model.num_hidden_layers,
            micro_batches=m,
            compute_per_micro_batch_s=shared * slowest.compute_s,
        ),
    )
    if cal is not None:
        slots = micro_batch_slots(layout, m, pipeline_schedules(layout, training.pipeline_flushes))
        time = calibrated_time(time, cal, slots)
    return _estimate_of(model, training, cluster, layout, time, _stage_estimates(model, layout, times, memories))


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticalPath:
    """A step's per-stage times and what its critical path makes of them (module docstring)."""

    micro_batches: int
    """Micro-batches per step on one replica (m)."""
    times: tuple[StageTime, ...]
    """Every stage's times per micro-batch (``timing.stage_times``)."""
    slowest: StageTime
    """The stage with the largest total: m of its micro-batches are on the critical path."""
    bubble_s: float
    """The pipeline bubble on the slowest stage, before the shared-core factor."""
    shared: float
    """The shared-core factor on the critical path's compute and bubble (``shared_cores``), in (0, 1]."""


def critical_path(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> CriticalPath:
    """The per-stage times, slowest stage, bubble and shared-core factor that both ``estimate``
    and ``schedule_timeline.estimate_timeline`` build on (arguments as for ``estimate``)."""
    m = num_micro_batches(training.global_batch_size, layout)
    times = stage_times(model, training, cluster, layout, routing=routing)
    slowest = max(times, key=lambda st: st.total_s)
    bubble = bubble_s(layout, m, slowest.total_s, pipeline_schedules(layout, training.pipeline_flushes))
    return CriticalPath(
        micro_batches=m,
        times=times,
        slowest=slowest,
        bubble_s=bubble,
        shared=shared_core_factor(times, m, bubble, cluster.pricing_device.core_share),
    )


def _stage_estimates(
    model: ModelSpec, layout: Layout, times: tuple[StageTime, ...], memories: tuple[MemoryBreakdown, ...]
) -> tuple[StageEstimate, ...]:
    """Each pipeline stage's layers, vocabulary layers, memory and compute per micro-batch."""
    layers = stage_layers(model, layout)
    held = all_stage_params(model, layout)
    return tuple(
        StageEstimate(
            stage=i,
            layers=layers[i],
            holds_embedding=params.holds_embedding,
            holds_output_layer=params.holds_output_layer,
            memory=memories[i],
            compute_per_micro_batch_s=times[i].compute_s + times[i].recompute_s,
        )
        for i, params in enumerate(held)
    )


def _estimate_of(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    time: TimeBreakdown,
    stages: tuple[StageEstimate, ...],
) -> Estimate:
    """The Estimate of a step taking ``time``: throughput, model and hardware FLOPs and their
    utilization of the world's peak (MFU, HFU; PaLM appendix B), the largest rank's memory."""
    step_s, world = time.step_time_s, layout.world_size
    peak = mean_peak_flop_per_s(cluster, layout, training.precision.gemm_inputs)
    model_flop = training.global_batch_size * model_flops_per_sequence(model, training.seq_len)
    ratio = hardware_flop_ratio(model, training.seq_len, layout.recompute, layout.recompute_modules)
    if layout.recompute_layers is not None:  # those layers re-run, the others not (layers weighed alike)
        ratio = 1.0 + (ratio - 1.0) * sum(layout.recompute_layers) / model.num_hidden_layers
    hardware_flop = model_flop * ratio
    host = cluster.host
    return Estimate(
        host_memory_per_node_bytes=host_memory_per_node_bytes(tuple(st.memory for st in stages), cluster, layout),
        host_memory_capacity_bytes=None if host is None else float(host.memory_bytes),
        step_time_s=step_s,
        tokens_per_s=training.tokens_per_step / step_s,
        model_flops_per_step=model_flop,
        hardware_flops_per_step=hardware_flop,
        mfu=model_flop / (step_s * world * peak),
        hfu=hardware_flop / (step_s * world * peak),
        peak_memory_bytes=max(stage.memory.total_bytes for stage in stages),
        memory_capacity_bytes=float(cluster.pricing_device.memory_bytes),
        stages=stages,
        time=time,
    )
