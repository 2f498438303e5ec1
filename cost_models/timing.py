"""Per-micro-batch time of each pipeline stage, split into compute, recompute and communication.

Each kind of layer's kernels, and the vocabulary layers', come from ``cost_models.layer_time``
(its docstring: GEMMs and elementwise traffic, FlashAttention, recomputation, the profile's
timed layers); a stage runs its layers of each kind, and the hottest rank's routed pairs beyond
the mean add the modeled expert GEMMs (``layer_time.LayoutKernels.experts``). Tensor- and
expert-parallel communication per layer come from ``cost_models.tensor_parallel`` and
``cost_models.expert_parallel``. Every micro-batch's
weight gradients are accumulated into fp32 buffers (Megatron-LM's main_grad, PyTorch AMP's
fp32 .grad): read the new gradient and the sum, write the sum, memory-bound. Each stage
does its share of the output layer and of the embedding (``StageParams.output_share``, ``embedding_share``):
all on the stage holding it when pinned, 1/p on every stage when the vocabulary is split over
the pipeline, which then waits for the part of its vocabulary collectives that its layers'
compute does not hide (``cost_models.vocabulary``). Under ZeRO 2-3 each sharded unit
(``StageParams.units``) adds, every micro-batch, what the profiler timed FSDP spending of its
own (``sharding.sharded_unit_s``; its collectives are priced in cost_models.data_parallel).
Under tensor parallelism, the profile's real tensor-parallel layer (``tp_layer``) is the
runtime's first layer, an MoE layer for an MoE model (experts split over the group): its time
beyond that layer's own local time (for an MoE layer, the measured dense local layer plus the
modeled MoE difference) is the tensor-parallel time, so that the layer's compute and its
tensor-parallel time add up to the record, the MoE part counted once. With the experts folded
(``Layout.folds_experts``: whole experts, each rank routing its own s b / t tokens) an MoE layer
runs attention's tensor-parallel collectives alone (``tensor_parallel.moe_layer_share``). With
``TrainingSpec.tp_comm_overlap`` under sequence
parallelism on GPUs, a layer waits only for the part of its tensor-parallel time that its dense
GEMMs do not hide (``overlap.tensor_parallel_exposed_s``). Under context parallelism each layer
waits for the part of its ring attention's
key/value exchange that the attention core's blocks do not hide, or for all of its all-to-alls
(``context_parallel.context_parallel_layer_s``).
Units: seconds.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from cost_models import groups as grp
from cost_models.comm import Group
from cost_models.compute import elementwise_time_s
from cost_models.context_parallel import context_parallel_layer_s, local_seq_len
from cost_models.expert_parallel import StageExpertLoad, expert_parallel_layer_s, stage_expert_loads
from cost_models.layer_time import LayoutKernels, shared_kernels
from cost_models.overlap import hides_communication, tensor_parallel_exposed_s
from cost_models.params import StageParams, all_stage_params, partially_recomputed
from cost_models.sharding import sharded_unit_s
from cost_models.stage_devices import priced_on, stage_devices
from cost_models.tensor_parallel import tensor_parallel_forward_backward_s, tensor_parallel_kind_s
from cost_models.vocabulary import NO_COMM, VocabularyComm, vocabulary_comm, vocabulary_tokens
from planner.schemas import ClusterProfile, DeviceProfile, Layout, ModelSpec, Precision, Recompute, TrainingSpec
from planner.schemas.device_map import IDENTITY
from planner.schemas.geometry import chunk_stage, embedding_chunk, output_chunk, stage_edge_layers, stage_layers
from planner.schemas.routing import RoutingStats


def grad_accumulation_bytes_per_param(precision: Precision) -> int:
    """Bytes moved to add one parameter's gradient (``Precision.gradients``, e bytes) into its
    accumulator (``Precision.gradient_accumulation``, fp32: 4): read e + 4, write 4."""
    accumulator = precision.gradient_accumulation.bytes
    return precision.gradients.bytes + accumulator + accumulator


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTime:
    """One micro-batch's forward + backward on one pipeline rank (all its chunks)."""

    compute_s: float
    recompute_s: float
    tensor_parallel_comm_s: float
    expert_parallel_comm_s: float
    backward_s: float
    """Backward compute alone: the window in which gradient reduction can overlap."""
    vocabulary_comm_s: float = 0.0
    """The vocabulary collectives over the pipeline group the stage waits for, when the
    vocabulary is split over it (``vocabulary.VocabularyComm.exposed_s``)."""
    context_parallel_comm_s: float = 0.0
    """The ring attention's key/value exchange its compute does not hide, or the all-to-all
    kind's all-to-alls (``context_parallel.context_parallel_layer_s``)."""

    @property
    def total_s(self) -> float:
        """Everything the stage spends on one micro-batch."""
        return (
            self.compute_s
            + self.recompute_s
            + self.tensor_parallel_comm_s
            + self.expert_parallel_comm_s
            + self.vocabulary_comm_s
            + self.context_parallel_comm_s
        )


def stage_times(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    *,
    tensor_groups: Iterable[Group] | None = None,
    expert_groups: Iterable[Group] | None = None,
    context_groups: Iterable[Group] | None = None,
    routing: RoutingStats | None = None,
) -> tuple[StageTime, ...]:
    """Per-micro-batch time of every pipeline stage (module docstring).

    Args:
        model: the model (its layers' work, its name for profiled records).
        training: sequence length, precision, attention kernel.
        cluster: the device and links.
        layout: degrees, micro-batch size, recompute, ZeRO stage.
        tensor_groups: the tensor-parallel groups (devices); default the layout's own
            (``cost_models.groups``), as for the next two.
        expert_groups: the expert-parallel groups (devices).
        context_groups: the context-parallel groups (devices); read only with cp > 1.
        routing: a routing trace's statistics; None assumes uniform routing. Each MoE layer's
            expert GEMMs and all-to-alls scale with its busiest rank's load
            (``expert_parallel.ExpertLoad``).

    Returns:
        One StageTime per pipeline rank, in pipeline order, in seconds per micro-batch. On a
        cluster of mixed device types each stage is priced on its own ranks' devices
        (``cost_models.stage_devices``).
    """
    tensor_groups = grp.tensor_groups(layout) if tensor_groups is None else tensor_groups
    expert_groups = grp.expert_groups(layout) if expert_groups is None else expert_groups
    context_groups = grp.context_groups(layout) if context_groups is None else context_groups
    devices = stage_devices(cluster, layout)
    if all(device is cluster.pricing_device for device in devices):
        return _stage_times(model, training, cluster, layout, tensor_groups, expert_groups, context_groups, routing)
    # Read once per device type: an iterator is kept for all of them; ``AxisGroups`` list theirs anew.
    tensor, expert, context = (
        tuple(g) if isinstance(g, Iterator) else g for g in (tensor_groups, expert_groups, context_groups)
    )
    priced = {
        id(device): _stage_times(model, training, priced_on(cluster, device), layout, tensor, expert, context, routing)
        for device in {id(device): device for device in devices}.values()
    }
    return tuple(priced[id(device)][s] for s, device in enumerate(devices))


def _stage_times(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    expert_groups: Iterable[Group],
    context_groups: Iterable[Group],
    routing: RoutingStats | None,
) -> tuple[StageTime, ...]:
    """``stage_times`` with every stage priced on ``cluster.pricing_device``: what every stage
    shares priced once (``_LayoutCosts``), then each stage (``_stage_time``), stages alike once.
    Under ``Layout.recompute_layers`` the layers a stage keeps are priced as the layout without
    recompute prices them, those it recomputes as under full recompute (``_stage_time``)."""
    full_costs, recomputed = None, partially_recomputed(model, layout)
    if layout.recompute_layers is not None:
        tensor_groups, expert_groups, context_groups = (
            tuple(g) if isinstance(g, Iterator) else g for g in (tensor_groups, expert_groups, context_groups)
        )
        every = replace(layout, recompute_layers=None)
        full_costs = _layout_costs(model, training, cluster, every, tensor_groups, expert_groups, context_groups)
        layout = replace(every, recompute=Recompute.NONE)
    costs = _layout_costs(model, training, cluster, layout, tensor_groups, expert_groups, context_groups)
    vocabulary = costs.vocabulary
    edges = stage_edge_layers(model, layout, training.fp8_bf16_layers)
    alike: dict[tuple[object, ...], StageTime] = {}  # stages holding the same layers and parameters take the same time
    out = []
    first, last = chunk_stage(layout, embedding_chunk(layout)), chunk_stage(layout, output_chunk(layout))
    for stage, (n, load, held) in enumerate(
        zip(
            stage_layers(model, layout),
            stage_expert_loads(model, training, layout, routing),
            all_stage_params(model, layout),
            strict=True,
        )
    ):
        roles = (stage == first, stage == last) if vocabulary.total_s else (False, False)
        key = (n, load, held, roles, edges[stage], recomputed[stage])
        stage_time = alike.get(key)
        if stage_time is None:
            stage_time = alike[key] = _stage_time(
                costs,
                training.precision,
                cluster.pricing_device,
                n,
                load,
                held,
                roles,
                edges[stage],
                recomputed=recomputed[stage],
                full=full_costs,
            )
        out.append(stage_time)
    return tuple(out)


def _layout_costs(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    expert_groups: Iterable[Group],
    context_groups: Iterable[Group],
) -> "_LayoutCosts":
    """What every stage of ``layout`` shares (``_LayoutCosts``)."""
    kernels = shared_kernels(model, training, cluster, layout)
    output_s, embed_s = _vocabulary_layers_share_s(model, training, cluster, layout, kernels)
    return _LayoutCosts(
        kernels=kernels,
        tp_exposed_s=_tensor_parallel_exposed_s(model, training, cluster, layout, kernels, tensor_groups),
        ep_layer_s=expert_parallel_layer_s(model, training, cluster, layout, expert_groups),
        cp_s=_context_parallel_s(model, training, cluster, layout, kernels, context_groups),
        output_s=output_s,
        embed_s=embed_s,
        vocabulary=(
            vocabulary_comm(model, training, cluster, layout, grp.pipeline_groups(layout))
            if layout.vocabulary_layout.over_pipeline
            else NO_COMM
        ),
        unit_s=sharded_unit_s(cluster.pricing_device, layout, training.precision.weights),
        overlapped=training.vocabulary_overlap and hides_communication(cluster),
        high_precision=_high_precision_kernels(model, training, cluster, layout),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _LayoutCosts:
    """What every stage of a layout shares, per micro-batch on one rank, in seconds."""

    kernels: LayoutKernels
    """Each kind of layer's kernels, the routed experts' GEMMs (``layer_time.shared_kernels``)."""
    high_precision: LayoutKernels | None
    """Under an FP8 recipe that keeps the first and last layers in the high precision
    (``TrainingSpec.fp8_bf16_layers``), the kernels without the recipe; else None."""
    tp_exposed_s: dict[bool, float]
    """Each kind of layer's tensor-parallel time it waits for (``_tensor_parallel_exposed_s``)."""
    ep_layer_s: float
    """One MoE layer's expert-parallel all-to-alls at a balanced load."""
    cp_s: dict[bool, float]
    """Each kind of layer's context-parallel time it waits for (``_context_parallel_s``)."""
    output_s: float
    """The output layer a stage holding all of it runs (``_vocabulary_layers_share_s``)."""
    embed_s: float
    """The embedding a stage holding all of it runs."""
    vocabulary: VocabularyComm
    """The vocabulary collectives over the pipeline group (none unless the vocabulary is split over it)."""
    unit_s: float
    """What FSDP spends of its own on one sharded unit (``sharding.sharded_unit_s``)."""
    overlapped: bool
    """Whether the vocabulary collectives may run behind the layers' compute."""


def _tensor_parallel_exposed_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    kernels: LayoutKernels,
    tensor_groups: Iterable[Group],
) -> dict[bool, float]:
    """Each kind of layer's tensor-parallel time (an MoE layer's a share of it when folded), and what
    of it the layer waits for: all, unless the collectives run in chunks behind its GEMMs."""
    t, kinds = layout.tensor_parallel_degree, kernels.kinds
    tp_fwd, tp_bwd = tensor_parallel_forward_backward_s(
        model, training, cluster, layout, tensor_groups, kernels.timed_local
    )
    tp_overlap = training.tp_comm_overlap and layout.sequence_parallel and t > 1 and hides_communication(cluster)
    tp_of = {
        moe: tensor_parallel_kind_s(model, layout, tp_fwd, tp_bwd, moe=moe, selective=training.selective_recompute)
        for moe in kinds
    }
    if not tp_overlap:
        return tp_of
    run = training.precision.fp8
    share = 1.0 if run is None else run.micro_pipelined_share  # what the overlap can run behind GEMMs
    return {moe: tensor_parallel_exposed_s(tp_of[moe], kinds[moe].gemm_s, t, share) for moe in kinds}


def _context_parallel_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    kernels: LayoutKernels,
    context_groups: Iterable[Group],
) -> dict[bool, float]:
    """Each kind of layer's context-parallel time it waits for, behind its attention core; 0 with cp 1."""
    kinds = kernels.kinds
    return {
        moe: context_parallel_layer_s(model, training, cluster, layout, context_groups, kinds[moe].attention_s)
        if layout.context_parallel_degree > 1
        else 0.0
        for moe in kinds
    }


def _vocabulary_layers_share_s(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, kernels: LayoutKernels
) -> tuple[float, float]:
    """(output layer, embedding) seconds a stage holding all of them runs: the whole layers'
    (``LayoutKernels.vocabulary_s``), or, split over the pipeline, every tp rank's share of the
    unsplit layers over its tokens (cost_models.vocabulary)."""
    if not layout.vocabulary_layout.over_pipeline:
        return kernels.vocabulary_s
    alone = (
        replace(
            layout,
            tensor_parallel_degree=1,
            sequence_parallel=False,
            expert_tensor_parallel_degree=None,
            expert_parallel_degree=1,
            expert_placement=None,
            device_map=IDENTITY,  # a map of the layout's t-times-larger world; the kernels do not read it
        )
        if layout.tensor_parallel_degree > 1
        else layout
    )
    tokens_share = vocabulary_tokens(training, layout) / (local_seq_len(training, layout) * layout.micro_batch_size)
    output_s, embed_s = (x * tokens_share for x in shared_kernels(model, training, cluster, alone).vocabulary_s)
    return output_s, embed_s


def _stage_time(
    costs: _LayoutCosts,
    precision: Precision,
    dev: DeviceProfile,
    n: int,
    load: StageExpertLoad,
    held: StageParams,
    roles: tuple[bool, bool],
    edges: tuple[int, int] = (0, 0),
    *,
    recomputed: tuple[int, int] = (0, 0),
    full: _LayoutCosts | None = None,
) -> StageTime:
    """One micro-batch on a stage of ``n`` layers with MoE loads ``load``, holding ``held``, and
    the first or last of the vocabulary's collectives by ``roles``: its layers of each kind, the
    hottest rank's expert work beyond the mean's, its vocabulary shares, gradient accumulation and
    sharded units. Under ``Layout.recompute_layers`` ``recomputed`` (dense, MoE) of its layers run
    as ``full`` (the layout under full recompute) prices them and the rest as ``costs`` does; the
    MoE layers' hot expert work and exchanges are split between the two in that proportion (the
    stage's mean load each), and its layers kept in the high precision are priced as kept."""
    counts = {False: n - load.moe_layers, True: load.moe_layers}
    here = [  # (layers, MoE, their kernels, what prices them)
        (count, moe, priced.kernels.kinds[moe], priced)
        for moe in costs.kernels.kinds
        for count, priced in ((counts[moe] - recomputed[moe], costs), (recomputed[moe], full or costs))
        if count
    ]
    moe_full = recomputed[True] / load.moe_layers if load.moe_layers and full is not None else 0.0
    shares = [(1.0 - moe_full, costs), (moe_full, full or costs)]
    embedding_share_s, output_share_s = held.embedding_share * costs.embed_s, held.output_share * costs.output_s
    extra = embedding_share_s + output_share_s
    extra += elementwise_time_s(grad_accumulation_bytes_per_param(precision) * held.total, dev)
    extra += held.units * costs.unit_s
    hot = load.compute_sum - load.moe_layers  # the hottest ranks' expert work beyond the mean's
    hot_parts = [(hot * share, priced.kernels.experts) for share, priced in shares if share]
    layers_s = sum((c * (k.forward_s + k.backward_s) for c, _, k, _ in here), 0.0)
    edge_s, edge_recompute_s, edge_backward_s = _edge_layers_s(costs, edges)
    layers_s += edge_s
    return StageTime(
        compute_s=layers_s + sum(h * (e.forward_s + e.backward_s) for h, e in hot_parts) + extra,
        recompute_s=sum((c * k.recompute_s for c, _, k, _ in here), 0.0)
        + sum(h * e.recompute_s for h, e in hot_parts)
        + edge_recompute_s,
        tensor_parallel_comm_s=sum((c * priced.tp_exposed_s[moe] for c, moe, _, priced in here), 0.0),
        expert_parallel_comm_s=sum(load.exchange_sum * share * priced.ep_layer_s for share, priced in shares if share),
        backward_s=sum((c * k.backward_s for c, _, k, _ in here), 0.0)
        + sum(h * e.backward_s for h, e in hot_parts)
        + edge_backward_s,
        vocabulary_comm_s=costs.vocabulary.exposed_s(
            layers_s,
            overlapped=costs.overlapped,
            first=roles[0],
            last=roles[1],
            embedding_share_s=embedding_share_s,
            output_share_s=output_share_s,
        ),
        context_parallel_comm_s=sum((c * priced.cp_s[moe] for c, moe, _, priced in here), 0.0),
    )


def _high_precision_kernels(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout
) -> LayoutKernels | None:
    """The kernels of the layers an FP8 recipe keeps in the high precision (``_LayoutCosts``)."""
    if training.fp8 is None or not training.fp8_bf16_layers:
        return None
    return shared_kernels(model, training.with_options({"fp8": None, "fp8_bf16_layers": 0}), cluster, layout)


def _edge_layers_s(costs: _LayoutCosts, edges: tuple[int, int]) -> tuple[float, float, float]:
    """What a stage's (dense, MoE) layers kept in the high precision take beyond their FP8 time:
    (forward and backward, recompute, backward) seconds."""
    if costs.high_precision is None:
        return 0.0, 0.0, 0.0
    kinds, high = costs.kernels.kinds, costs.high_precision.kinds
    pairs = [(count, kinds[moe], high[moe]) for moe, count in zip((False, True), edges, strict=True) if count]
    both = sum(c * (h.forward_s + h.backward_s - k.forward_s - k.backward_s) for c, k, h in pairs)
    return (
        both,
        sum(c * (h.recompute_s - k.recompute_s) for c, k, h in pairs),
        sum(c * (h.backward_s - k.backward_s) for c, k, h in pairs),
    )
