"""Per-rank memory of a layout, per pipeline stage, in bytes: its terms, summed.

Sources: model states under ZeRO from Rajbhandari et al. (SC20) sec. 5 (``cost_models.sharding``,
with ZeRO-3's gathered buffer); activations from Korthikanti et al. 2022
(``cost_models.activations``), a stage's in ``cost_models.stage_activations``; the loss's logits
in ``cost_models.loss_memory``; gradient buckets and staging buffers in
``cost_models.communication_buffers``; micro-batches in flight from ``schemas.geometry``; the
stage's parameters from ``cost_models.params``.

Constants (conventions, stated once here; each other term's with its module):
  - ``CUDA_WORKSPACE_BYTES`` = 1 GiB per rank on a CUDA device: the CUDA context with PyTorch's
    kernels loaded (about 0.3-0.6 GiB on A100/H100 with CUDA 12 lazy loading), cuBLAS workspaces
    (PyTorch's default on Hopper is 32 MiB per handle and stream), NCCL's per-communicator
    buffers (NCCL_BUFFSIZE 4 MiB per channel and peer, over the tp/dp/pp communicators) and
    some caching-allocator slack. 0 on a device whose name contains "cpu". This is not a
    fragmentation margin: callers keep their own safety margin on top.
"""

from dataclasses import replace
from typing import Final

from cost_models.communication_buffers import (
    communication_buffer_bytes,
    pipeline_buffer_bytes,
    reduce_scatter_staging_bytes,
    tied_gradient_sum_bytes,
)
from cost_models.expert_parallel import stage_expert_loads
from cost_models.fp8_weights import fp8_weight_bytes
from cost_models.layout_validity import check_stage
from cost_models.loss_memory import freed_loss_bytes, stage_logits_bytes
from cost_models.offload import offloaded_states_share, offloaded_weight_copy_bytes, rank_host_bytes
from cost_models.params import (
    StageParams,
    activation_offloaded,
    all_stage_params,
    partially_recomputed,
    stage_moe_layers,
    stage_params,
)
from cost_models.sharding import ModelStates, stage_model_states
from cost_models.stage_activations import schedule_micro_batches, stage_activation_terms, stage_mlp_backward_bytes
from planner.schemas import ClusterProfile, DeviceKind, Layout, MemoryBreakdown, ModelSpec, TrainingSpec
from planner.schemas.geometry import chunk_stage, in_flight_micro_batches, num_micro_batches, output_chunk, stage_layers
from planner.schemas.routing import RoutingStats
from planner.schemas.stacks import stack_named

CUDA_WORKSPACE_BYTES: Final = 1 << 30


def workspace_bytes(cluster: ClusterProfile) -> float:
    """Framework workspace of one rank: ``CUDA_WORKSPACE_BYTES``, or 0 on a CPU device."""
    return 0.0 if cluster.pricing_device.kind is DeviceKind.CPU else float(CUDA_WORKSPACE_BYTES)


def stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    stage: int,
    routing: RoutingStats | None = None,
) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``stage``, by term (``LayoutMemory.stage``).

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
        InfeasibleConfigError: the global batch gives no whole micro-batch per replica.
    """
    check_stage(layout, stage)
    return LayoutMemory(model, training, cluster, layout, routing).stage(stage)


class LayoutMemory:
    """The memory of each pipeline stage of one layout, priced on demand.

    Model states of ``stage_params`` under ZeRO from ``sharding.stage_model_states`` (under a
    pipeline ZeRO 2-3 hold what ZeRO-1 holds), and with the weights the FP8 copies an FP8 recipe's
    library keeps (``fp8_weights``). Activations from ``stage_activations.stage_activation_bytes``.
    What lives only in a layer's backward, after the loss before it is freed
    (``loss_memory.freed_loss_bytes``: on the stage with the output layer one micro-batch's logits,
    elsewhere nothing), fills that loss first and adds what it exceeds it by, in this order: the
    staging buffer (counted with the buffers), one MLP's backward transient
    (``stage_activations.stage_mlp_backward_bytes``) and the layer a recompute rematerialized (with
    the activations), ZeRO-3's gathered units (with the weights). On llama3-8b's dp16 ZeRO-3 under
    full recompute, summing them put the estimate at 1.22x the dry run's trace; filling, 1.04x (the
    trace's peak is the loss, with no unit gathered). Logits from
    ``loss_memory.stage_logits_bytes``; buffers from ``communication_buffers``:
    ``communication_buffer_bytes`` and ``pipeline_buffer_bytes`` and what
    ``reduce_scatter_staging_bytes`` exceeds the logits by and ``tied_gradient_sum_bytes`` the
    activations and logits by (they live after them); workspace from ``workspace_bytes``. Gradients
    a stack allocates on demand (``Stack.gradients_on_demand``) on a stage that runs no forward
    after its first backward (every micro-batch of the step in flight) fill as that backward frees
    one micro-batch's activations and what the transients left of its loss: they add what they
    exceed those by (llama3-8b dp8 ZeRO-1, one micro-batch: the dry run traced the sum less the
    gradients, 47,563 MiB against 62,805 summed). Other terms are summed as if they peak together
    (an upper bound). A calibrated cluster scales the activations, logits and buffers and adds its
    memory overhead to the workspace. The optimizer states a layout offloads are the host's
    (``MemoryBreakdown.host_bytes``), less the weight copy they leave (``cost_models.offload``), and
    so are what the layers a layout offloads activations of keep (``Layout.activation_offload_layers``).

    What the stages share is computed once: the micro-batches, the MoE loads and layers per stage,
    and every term of stages that hold the same parameters, layers and loads (a pipeline's middle
    stages), which then differ only in their micro-batches in flight. A search asks for the
    first stage alone (most layouts that do not fit fail there) and for the others only if needed.

    Raises (on construction):
        InfeasibleConfigError: the global batch gives no whole micro-batch per replica.
    """

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        cluster: ClusterProfile,
        layout: Layout,
        routing: RoutingStats | None = None,
    ) -> None:
        self._model, self._training, self._layout = model, training, layout
        self._micro_batches = schedule_micro_batches(training, layout)
        self._step_micro_batches = num_micro_batches(training.global_batch_size, layout)
        self._gradients_on_demand = stack_named(training.stack).gradients_on_demand
        self._loads = stage_expert_loads(model, training, layout, routing)
        self._layers = stage_layers(model, layout)
        self._moe_layers = stage_moe_layers(model, layout)
        self._recomputed = partially_recomputed(model, layout)
        self._offloaded = activation_offloaded(model, layout)
        self._params = all_stage_params(model, layout)
        self._last_stage = chunk_stage(layout, output_chunk(layout))
        cal = cluster.calibration
        self._scales = (
            (cal.activation_memory_scale, cal.logits_memory_scale, cal.buffer_memory_scale) if cal else (1.0, 1.0, 1.0)
        )
        self._workspace_bytes = _calibrated_workspace_bytes(cluster)
        self._device = cluster.pricing_device
        self._terms: dict[object, tuple[ModelStates, float, float, float, float, float, float, float]] = {}

    def stage(self, stage: int) -> MemoryBreakdown:
        """Peak bytes of one rank of pipeline stage ``stage``, by term.

        Raises:
            SchemaError: ``stage`` is not a pipeline rank of the layout.
        """
        model, training, layout = self._model, self._training, self._layout
        check_stage(layout, stage)
        params, load = self._params[stage], self._loads[stage]
        layers, moe, last = self._layers[stage], self._moe_layers[stage], stage == self._last_stage
        recomputed = self._recomputed[stage]
        key = (params, load, layers, moe, last, recomputed)
        activation_scale, logits_scale, buffer_scale = self._scales
        terms = self._terms.get(key)
        if terms is None:
            per_micro_batch, once, rematerialized, host = stage_activation_terms(
                model,
                training,
                layout,
                params,
                load,
                layers,
                moe,
                last,
                self._micro_batches,
                recomputed,
                self._offloaded,
            )
            backward = stage_mlp_backward_bytes(model, training, layout, load, layers, moe)
            logits = stage_logits_bytes(model, training, layout, stage, params)
            # The staging buffer lives after the loss's backward: it adds what it exceeds the logits by.
            # A layer's backward runs beside it, after one micro-batch's loss is freed, with its MLP's
            # transient, the layer a recompute rematerialized and ZeRO-3's gathered units: they add
            # what they exceed that loss by, of which the staging buffer's share is counted already
            staging = reduce_scatter_staging_bytes(training, layout, params)
            # (no more than the calibrated logits hold: what fills it never outgrows the logits term)
            freed = freed_loss_bytes(training, layout, params, logits, self._micro_batches) * min(1.0, logits_scale)
            states = stage_model_states(model, layout, params, training.precision)
            transients = (staging, backward, rematerialized, states.gathered_bytes)
            _, mlp, layer, gathered = _beyond(freed, *transients)
            states = replace(states, weights_bytes=states.weights_bytes - states.gathered_bytes + gathered)
            states = _offloaded(states, params, layout, training, gathered)
            terms = (
                states,
                per_micro_batch,
                once + mlp + layer,
                logits,
                communication_buffer_bytes(model, training, layout, params, load.compute_max)
                + max(0.0, staging - logits),
                fp8_weight_bytes(model, training, layout, self._device, layers - moe, moe),
                max(0.0, freed - sum(transients)),  # what the gradients may fill of it
                host,
            )
            self._terms[key] = terms
        states, per_micro_batch, once, logits, buffers, fp8_weights, loss_left, host = terms
        in_flight = in_flight_micro_batches(
            layout, stage, self._micro_batches, vocabulary_warmup=training.vocabulary_overlap
        )
        activations = per_micro_batch * in_flight + once
        gradients = states.gradients_bytes
        if self._gradients_on_demand and in_flight >= self._step_micro_batches:
            # No forward follows the stage's first backward: the gradients it allocates replace the
            # activations and loss it frees (Stack.gradients_on_demand), what the backward's
            # transients left of the loss, and add what they exceed them by
            freed_bytes = per_micro_batch * activation_scale + loss_left * logits_scale
            gradients = max(0.0, gradients - freed_bytes)
        # The tied gradient sum's copy lives after the backward: it adds what it exceeds them by
        tied = max(0.0, tied_gradient_sum_bytes(model, training, layout, stage) - activations - logits)
        buffers += pipeline_buffer_bytes(model, training, layout, stage, self._micro_batches, in_flight)
        return MemoryBreakdown(
            weights_bytes=states.weights_bytes + fp8_weights,
            gradients_bytes=gradients,
            optimizer_states_bytes=states.optimizer_states_bytes,
            activations_bytes=activations * activation_scale,
            logits_bytes=logits * logits_scale,
            communication_buffers_bytes=(buffers + tied) * buffer_scale,
            workspace_bytes=self._workspace_bytes,
            host_bytes=rank_host_bytes(params, layout, training.precision) + host * in_flight * activation_scale,
        )

    def all(self) -> tuple[MemoryBreakdown, ...]:
        """Every stage's, in pipeline order."""
        return tuple(self.stage(s) for s in range(self._layout.pipeline_parallel_degree))


def _offloaded(
    states: ModelStates, params: StageParams, layout: Layout, training: TrainingSpec, gathered: float
) -> ModelStates:
    """``states`` less the optimizer states ``layout`` offloads to the host under the training's
    stack, with the weight copy the offloaded share then keeps on the device (``cost_models.offload``);
    under ``Layout.parameter_offload`` the device holds only the units it gathers (``gathered``
    bytes of them): every shard is the host's."""
    fraction = layout.optimizer_offload_fraction
    if fraction <= 0:
        return states
    if layout.parameter_offload:
        return replace(states, weights_bytes=gathered, gradients_bytes=0.0, optimizer_states_bytes=0.0)
    stack = stack_named(training.stack)
    share = offloaded_states_share(training.precision, stack)
    copy = offloaded_weight_copy_bytes(params, layout, training.precision) if stack.offloads_master_weights else 0.0
    return replace(
        states,
        weights_bytes=states.weights_bytes + copy,
        optimizer_states_bytes=states.optimizer_states_bytes * (1.0 - fraction * share),
    )


def _beyond(freed: float, *transients: float) -> tuple[float, ...]:
    """What each of ``transients``, taken in order, adds beyond ``freed`` bytes they fill first."""
    added, held = [], 0.0
    for t in transients:
        added.append(max(0.0, held + t - freed) - max(0.0, held - freed))
        held += t
    return tuple(added)


def gradients_replace_activations(training: TrainingSpec, layout: Layout) -> bool:
    """Whether some stage's gradients replace the activations its first backward frees, rather
    than add to them (``LayoutMemory``): the stack allocates gradients on demand and the first
    stage, which holds the most micro-batches in flight, runs no forward after its first backward.

    Once True for a micro-batch size it stays True for larger ones (fewer micro-batches), and
    memory is non-decreasing in the micro-batch size among layouts where it is False, not across
    them (a larger micro-batch frees more activations for the gradients): a search may rule out
    larger micro-batches of a layout found too big only where this is False.
    """
    if not stack_named(training.stack).gradients_on_demand:
        return False
    m = num_micro_batches(training.global_batch_size, layout)
    first = in_flight_micro_batches(
        layout, 0, schedule_micro_batches(training, layout), vocabulary_warmup=training.vocabulary_overlap
    )
    return first >= m


def stage_memory_floor(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, stage: int
) -> MemoryBreakdown:
    """The terms of ``stage_memory`` that no micro-batch size, recompute, sequence parallelism
    or kind of context parallelism changes: model states and workspace, the other terms 0.

    Its total is at most ``stage_memory``'s (the terms left at 0 are never negative, and rounding
    a sum of floats is monotone in each term), so a layout whose floor does not fit does not fit
    with any micro-batch size, recompute or sequence parallelism: a search prunes with it.

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
    """
    params = stage_params(model, layout, stage)
    states = _offloaded(stage_model_states(model, layout, params, training.precision), params, layout, training, 0.0)
    return MemoryBreakdown(
        weights_bytes=states.weights_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_states_bytes=states.optimizer_states_bytes,
        activations_bytes=0.0,
        logits_bytes=0.0,
        communication_buffers_bytes=0.0,
        workspace_bytes=_calibrated_workspace_bytes(cluster),
    )


def _calibrated_workspace_bytes(cluster: ClusterProfile) -> float:
    """``workspace_bytes`` plus a calibrated cluster's memory overhead (which may be negative)."""
    cal = cluster.calibration
    return workspace_bytes(cluster) + (cal.memory_overhead_bytes if cal else 0.0)


def all_stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> tuple[MemoryBreakdown, ...]:
    """``stage_memory`` of every pipeline stage, in pipeline order."""
    return LayoutMemory(model, training, cluster, layout, routing).all()


def peak_stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> MemoryBreakdown:
    """The breakdown of the stage whose rank needs the most memory (the first such stage on ties)."""
    return max(all_stage_memory(model, training, cluster, layout, routing), key=lambda mem: mem.total_bytes)
