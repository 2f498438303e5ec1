"""Per-micro-batch time of one layer of each kind, and of the vocabulary layers, on one rank of a
layout: the kernel times every pipeline stage shares (``cost_models.timing`` adds them up per stage).

Forward and backward of every layer come from its GEMM shapes and elementwise traffic
(cost_models.layer_work, cost_models.compute). The backward of a GEMM is its input- and
weight-gradient GEMMs; elementwise backward moves twice the forward's bytes. FlashAttention
skips the masked half of a causal s x s product and its backward runs 5 GEMMs to the
forward's 2 (Dao 2023, FlashAttention-2, sec. 3), so it costs 2.5 forwards; it runs at the rates
the profile's attention records give (``compute.fused_attention_s``: the kernel as published or
timed, well below the matmul rate), else at the matmul rate. Recomputation
(Korthikanti et al. 2022): full repeats the layer's forward; selective repeats the modules the
layout names (``Layout.recompute_modules``, Megatron-Core's ``--recompute-modules``): by default
the attention core (nothing extra under FlashAttention, which already recomputes it), and the
norms, the experts' activation, a dense MLP or a whole MoE block (``_selective_recompute_s``), at
most the layer's forward. Where the profile
timed this model's own layer (``compute.measured_layer_s``), that time replaces the layer's
kernels: it holds every small op and launch the kernel sum leaves out. An MoE layer is priced
from the profile's timing of the runtime's own MoE layer (``compute.measured_moe_layer_s``:
router, top-k routing and every expert on one rank, uniform routing as untrained routers on
random inputs give) where there is one. Under expert parallelism each rank computes about the
same routed pairs as there (P = k s b, ``cost_models.expert_parallel``) over fewer experts, so
that layer is the base for every ep; the all-to-alls are priced on their own, and the hottest
rank's pairs beyond the mean add the modeled expert GEMMs (``_expert_gemms_time``). Without
that record (a version-2 profile, tensor parallelism, a model the runtime does not build as it
is) an MoE layer is the measured dense layer (``profiler.layer``) plus the modeled difference
between its MLP (router, routed and shared experts, permutation) and that dense one.
The output layer (final norm, head, loss) likewise, where the profile timed the runtime's own,
vocabulary-parallel under tensor parallelism, its collectives counted as its compute. With the
experts folded (``Layout.folds_experts``: whole experts, each rank routing its own s b / t
tokens) an MoE layer is priced from its modeled kernels over the measured dense layer, the
runtime's MoE layer (which splits experts over t) not being what runs. Under context
parallelism a rank's kernels run over its s / cp tokens of each sequence (``layer_work``; the
profile's timed layers, over whole sequences, are not read).
Units: seconds.
"""

from dataclasses import dataclass

from cost_models import layer_work as lw
from cost_models import linear_gemms
from cost_models.compute import (
    Gemm,
    backward_gemms_time_s,
    elementwise_time_s,
    fused_attention_s,
    gemm_time_s,
    gemms_time_s,
    measured_layer_s,
    measured_moe_layer_s,
    measured_output_layer_s,
)
from cost_models.context_parallel import attention_calls
from cost_models.memo import HeldMemo
from planner.schemas import (
    ClusterProfile,
    DeviceProfile,
    Layout,
    ModelSpec,
    Precision,
    Recompute,
    RecomputeModule,
    SelectiveRecompute,
    TrainingSpec,
)
from planner.schemas.geometry import num_micro_batches


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutKernels:
    """One micro-batch's kernel times on one rank that every stage of a layout shares."""

    kinds: dict[bool, "LayerTime"]
    """Each kind of layer the model has (dense False, MoE True)."""
    timed_local: tuple[float, float] | None
    """Forward and backward of the layer the profiler timed under tensor parallelism (the
    runtime's layer 0, an MoE layer for an MoE model) as it runs alone, where the profile timed
    this model's layer: ``tensor_parallel_layer_s`` takes what the tp record adds beyond it."""
    experts: "LayerTime"
    """A balanced MoE layer's routed-expert GEMMs on one rank (zero for a dense model)."""
    vocabulary_s: tuple[float, float]
    """The whole output layer's and embedding's seconds (``_vocabulary_layers_s``)."""


_KERNELS: HeldMemo[LayoutKernels] = HeldMemo(limit=4096)
"""``_kernels`` by what it reads: a search's many layouts share few (t, b, sp, ep, etp, recompute)."""


def shared_kernels(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> LayoutKernels:
    """``_kernels``, memoized on what it reads of the layout and on the device object."""
    key = (
        model,
        training,
        layout.tensor_parallel_degree,
        layout.micro_batch_size,
        layout.sequence_parallel,
        layout.expert_parallel_degree,
        layout.expert_tensor_parallel_degree,
        layout.recompute,
        layout.recompute_modules,
        layout.context_parallel_degree,
        layout.context_parallel_kind,  # the attention kernel's calls (context_parallel.attention_calls)
        _micro_batches(training, layout),  # Transformer Engine's FP8 weight casts, once a step
    )
    return _KERNELS.get(cluster.pricing_device, key, lambda: _kernels(model, training, cluster, layout))


def _kernels(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> LayoutKernels:
    """Each kind of layer's time (from the profile's timing of this model's dense or MoE layer
    where there is one), the routed experts' GEMMs and the vocabulary layers of ``layout``.
    Under context parallelism the profile's layers (timed over whole sequences, without the ring)
    are not what a rank runs: its kernels are priced from its share (``layer_work``)."""
    dev, weights = cluster.pricing_device, training.precision.weights  # the precision the profiler built the layer in
    t, b = layout.tensor_parallel_degree, layout.micro_batch_size
    whole = layout.context_parallel_degree == 1
    measured = measured_layer_s(dev, model.name, weights, t, b, training.seq_len) if whole else None
    measured_moe = (
        measured_moe_layer_s(dev, model.name, weights, t, b, training.seq_len)
        if whole and model.is_moe and not layout.folds_experts
        else None
    )
    kinds = {
        moe: _layer_time(model, training, cluster, layout, measured, measured_moe if moe else None, moe=moe)
        for moe in _layer_kinds(model)
    }
    # The profiler's real tensor-parallel layer is the runtime's layer 0, an MoE layer for an MoE
    # model: what it takes beyond the same layer's local time is tensor-parallel time.
    timed = kinds.get(model.is_moe) or _layer_time(
        model, training, cluster, layout, measured, measured_moe, moe=model.is_moe
    )
    none = LayerTime(forward_s=0.0, backward_s=0.0, recompute_s=0.0, attention_s=(0.0, 0.0))
    return LayoutKernels(
        kinds=kinds,
        timed_local=None if measured is None else (timed.forward_s, timed.backward_s),
        experts=_expert_gemms_time(model, training, cluster, layout) if True in kinds else none,
        vocabulary_s=_vocabulary_layers_s(model, training, cluster, layout),
    )


def _vocabulary_layers_s(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout
) -> tuple[float, float]:
    """(output layer, embedding) seconds of one micro-batch on one rank of ``layout``, whole: the
    profiled output layer where there is one, else its GEMM and elementwise traffic."""
    dev, precision = cluster.pricing_device, training.precision
    output_s = (
        measured_output_layer_s(
            dev,
            model.name,
            precision.weights,
            layout.tensor_parallel_degree,
            layout.micro_batch_size,
            training.seq_len,
            sequence_parallel=layout.sequence_parallel,
        )
        if layout.context_parallel_degree == 1
        else None
    )
    if output_s is None:
        gemm = lw.output_layer_gemm(model, training, layout)
        traffic = lw.output_layer_elementwise(model, training, layout)
        elementwise = elementwise_time_s(traffic.bytes, dev, traffic.kernels)
        gemm_dtype = precision.gemm_inputs
        output_s = gemm_time_s(gemm, dev, gemm_dtype) + backward_gemms_time_s((gemm,), dev, gemm_dtype) + elementwise
    return output_s, 3 * elementwise_time_s(lw.embedding_elementwise_bytes(model, training, layout), dev)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTime:
    """Forward, backward and recompute seconds of one layer (or of one rank's routed experts), one
    micro-batch, one rank."""

    forward_s: float
    backward_s: float
    recompute_s: float
    gemm_s: float = 0.0
    """The layer's dense GEMMs (projections and MLP or shared experts), forward, backward and
    recomputed: what its tensor-parallel collectives can run behind."""
    attention_s: tuple[float, float] = (0.0, 0.0)
    """The attention core's forward and backward: what a context-parallel ring runs behind."""


def _expert_gemms_time(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> LayerTime:
    """Forward, backward and recompute seconds of one rank's routed experts in a balanced MoE
    layer (``layer_work.expert_gemms``); recomputing the MoE block (full, or selective with
    ``moe``) repeats the forward."""
    gemms, precision, dev = lw.expert_gemms(model, training, layout), training.precision, cluster.pricing_device
    forward = linear_gemms.forward_s(gemms, dev, precision, _micro_batches(training, layout))
    recompute = forward if layout.recomputes(RecomputeModule.MOE) else 0.0
    return LayerTime(
        forward_s=forward, backward_s=linear_gemms.backward_s(gemms, dev, precision), recompute_s=recompute
    )


def _micro_batches(training: TrainingSpec, layout: Layout) -> int:
    """Micro-batches a replica runs a step (over which Transformer Engine casts its cached FP8
    weights once: ``linear_gemms``); 1 where nothing reads it, so that the kernels' memo keys need
    not hold the data-parallel degree (``shared_kernels``)."""
    run = training.precision.fp8
    return num_micro_batches(training.global_batch_size, layout) if run and run.caches_fp8_weights else 1


def _layer_kinds(model: ModelSpec) -> tuple[bool, ...]:
    """Which kinds of layer the model has: dense (False), MoE (True) or both."""
    moe = model.num_moe_layers
    return tuple(kind for kind, count in ((False, model.num_hidden_layers - moe), (True, moe)) if count)


def _fused_attention_s(
    causal_flop: float, model: ModelSpec, training: TrainingSpec, layout: Layout, device: DeviceProfile
) -> tuple[float, float] | None:
    """Forward and backward seconds of the rank's attention core of ``causal_flop`` forward FLOPs
    (4 d per query-key pair the causal mask leaves visible), call by call
    (``context_parallel.attention_calls``), each its share of them; None without an attention
    record."""
    forward_s = backward_s = 0.0
    for call in attention_calls(training, layout):
        times = fused_attention_s(
            causal_flop * call.share,
            call.seq_len,
            model.qk_head_size,
            device,
            training.precision.attention,
            training.attention_kernel,
            causal=call.causal,
        )
        if times is None:
            return None
        forward_s, backward_s = forward_s + times[0], backward_s + times[1]
    return forward_s, backward_s


def _layer_time(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    measured: tuple[float, float] | None,
    measured_moe: tuple[float, float] | None = None,
    *,
    moe: bool,
) -> LayerTime:
    """Forward, backward and recompute seconds of one dense or MoE layer and micro-batch:
    ``measured_moe`` (the runtime's MoE layer, timed) for an MoE layer where there is one, else
    ``measured`` (the dense local layer, timed; an MoE layer adds its modeled difference), else
    the modeled kernels."""
    dev, precision = cluster.pricing_device, training.precision
    attention_dtype, micro_batches = precision.attention, _micro_batches(training, layout)
    work = lw.layer_work(model, training, layout, moe=moe)
    elem_fwd = elementwise_time_s(work.elementwise_bytes, dev, work.elementwise_kernels)
    dense_fwd = linear_gemms.forward_s(work.dense_gemms, dev, precision, micro_batches)
    dense_bwd = linear_gemms.backward_s(work.dense_gemms, dev, precision)
    # the kernel's rates at the calls it runs: by length and mask under context parallelism
    fused = (
        _fused_attention_s(0.5 * sum(g.flop for g in work.attention_gemms), model, training, layout, dev)
        if work.flash_attention
        else None
    )
    if fused is not None:  # the attention kernel's own rate, as the profile records it
        attn_fwd, attn_bwd = fused
    elif work.flash_attention:  # no record: the causal half of its GEMMs at the matmul rate
        attn_fwd = 0.5 * gemms_time_s(work.attention_gemms, dev, attention_dtype)
        attn_bwd = 2.5 * attn_fwd
    else:
        attn_elem = elementwise_time_s(work.attention_elementwise_bytes, dev)
        attn_fwd = gemms_time_s(work.attention_gemms, dev, attention_dtype) + attn_elem
        attn_bwd = backward_gemms_time_s(work.attention_gemms, dev, attention_dtype) + 2 * attn_elem
    layer_fwd = dense_fwd + attn_fwd + elem_fwd
    layer_bwd = dense_bwd + attn_bwd + 2 * elem_fwd
    if moe and measured_moe is not None:  # the profiler timed the runtime's own MoE layer: everything it launches
        layer_fwd, layer_bwd = _with_fp8(measured_moe, work.dense_gemms, dev, precision, micro_batches)
    elif measured is not None:  # the profiler timed this model's own layer: everything it launches
        timed_work = work if not moe else lw.layer_work(model, training, layout, moe=False)
        fwd, bwd = _with_fp8(measured, timed_work.dense_gemms, dev, precision, micro_batches)
        if moe:  # it timed a dense MLP (profiler.layer): add what the experts, router and routing cost beyond it
            dense = _layer_time(model, training, cluster, layout, None, moe=False)
            fwd, bwd = fwd + layer_fwd - dense.forward_s, bwd + layer_bwd - dense.backward_s
        layer_fwd, layer_bwd = fwd, bwd
    block = RecomputeModule.MOE if moe else RecomputeModule.MLP
    block_gemms_s = (
        linear_gemms.forward_s(work.mlp_gemms, dev, precision, micro_batches) if layout.recomputes(block) else 0.0
    )
    if layout.recompute is Recompute.FULL:
        recompute, gemms_again_s = layer_fwd, dense_fwd
    elif layout.recompute is Recompute.SELECTIVE and _per_op(training, work):
        # torchtitan's per-op policy: the even matmuls and every elementwise op
        gemms_again_s = linear_gemms.forward_s(work.every_other_gemms, dev, precision, micro_batches)
        recompute = min(gemms_again_s + elem_fwd, layer_fwd)
    elif layout.recompute is Recompute.SELECTIVE:
        recompute, gemms_again_s = (
            _selective_recompute_s(work, layout, dev, attn_fwd, block_gemms_s, moe=moe),
            block_gemms_s,
        )
        recompute = min(recompute, layer_fwd)  # never more than the whole forward (a timed layer's)
    else:
        recompute, gemms_again_s = 0.0, 0.0
    gemm_s = dense_fwd + dense_bwd + gemms_again_s
    return LayerTime(
        forward_s=layer_fwd,
        backward_s=layer_bwd,
        recompute_s=recompute,
        gemm_s=gemm_s,
        attention_s=(attn_fwd, attn_bwd),
    )


def _with_fp8(
    timed: tuple[float, float], gemms: tuple[Gemm, ...], dev: DeviceProfile, precision: Precision, micro_batches: int
) -> tuple[float, float]:
    """A layer the profiler timed with its linear ``gemms`` in the high precision, as it runs
    under ``precision``: plus what an FP8 recipe changes in those GEMMs (``linear_gemms``)."""
    forward, backward = linear_gemms.fp8_change_s(gemms, dev, precision, micro_batches)
    return timed[0] + forward, timed[1] + backward


def _per_op(training: TrainingSpec, work: lw.LayerWork) -> bool:
    """Whether selective recompute runs as torchtitan's per-op policy on this layer
    (``SelectiveRecompute.EVERY_OTHER_MATMUL``, priced where the layer has ``every_other_gemms``)."""
    return training.selective_recompute is SelectiveRecompute.EVERY_OTHER_MATMUL and bool(work.every_other_gemms)


def _selective_recompute_s(
    work: lw.LayerWork, layout: Layout, dev: DeviceProfile, attn_fwd_s: float, block_gemms_s: float, *, moe: bool
) -> float:
    """Seconds one layer's backward spends re-running its ``Layout.recompute_modules`` (each as
    Megatron-Core runs it: ``RecomputeModule``): core_attn the attention core's forward (nothing
    under FlashAttention, whose backward recomputes it anyway); layernorm the two norms; moe_act
    the routed experts' activation; mlp (moe) the block's GEMMs (``block_gemms_s``) and
    elementwise kernels, which hold moe_act's. The MoE block's all-to-alls and a block's
    tensor-parallel collectives are priced with their kind (``expert_parallel``, ``tensor_parallel``)."""
    seconds = 0.0
    if layout.recomputes(RecomputeModule.CORE_ATTN) and not work.flash_attention:
        seconds += attn_fwd_s
    if layout.recomputes(RecomputeModule.LAYERNORM):
        seconds += elementwise_time_s(work.norms.bytes, dev, work.norms.kernels)
    if layout.recomputes(RecomputeModule.MOE if moe else RecomputeModule.MLP):
        seconds += block_gemms_s + elementwise_time_s(work.mlp_elementwise.bytes, dev, work.mlp_elementwise.kernels)
    elif moe and layout.recomputes(RecomputeModule.MOE_ACT):
        seconds += elementwise_time_s(work.expert_activation.bytes, dev, work.expert_activation.kernels)
    return seconds
