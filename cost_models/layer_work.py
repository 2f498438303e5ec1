"""The work of one transformer layer (and of the embedding and output layers) for one
micro-batch on one tensor-parallel rank: its GEMMs and the bytes its elementwise kernels move.

GEMM shapes follow Megatron-LM's tensor parallelism (Shoeybi et al. 2019): q/k/v and the MLP
up-projections are split by columns, the output and down projections by rows, attention heads
by t. Elementwise traffic is counted operation by operation, as fused or eager kernels run it
(``cost_models.kernels``, ``TrainingSpec.kernels``; forward; the backward moves about twice as
much), with T = b s / cp tokens (the rank's share of the micro-batch under context parallelism,
``cost_models.context_parallel``), T' = T / t under sequence parallel:
- two norms and two dropout-residual adds over T' h;
- the MLP activation (GELU, or SwiGLU) over T f/t;
- rotary embedding over the q and k slices (ALiBi's bias is added inside the attention kernel,
  and to the stored scores under eager attention); Qwen3's q/k norms over them;
- eager kernels copy the attention core's output back to token-major layout;
- the attention core: the rank's s / cp queries against all s keys, 1/cp of the layer's scores
  (balanced for causal attention by the zig-zag split);
- eager attention: scale-mask-softmax reads and writes b (a/t) (s/cp) s e, attention dropout reads
  and writes it again plus a 1-byte mask; FlashAttention keeps scores on chip and moves nothing;
- MoE: permuting tokens to experts and back reads and writes T k h e twice (two kernels); routed experts
  are moe_intermediate_size wide, shared experts see all T tokens, split over t as a dense MLP;
  with the experts folded (``Layout.folds_experts``) a rank routes (router, permutation) its own
  T / t tokens and its experts are whole, seeing the group's pairs for them (``expert_gemms``);
- MLA (DeepSeek-V2/V3, as Megatron-Core's MultiLatentAttention): down-projections q_a, kv_a
  whole on every rank, up-projections q_b, kv_b split by heads, o by rows; its two latent
  RMSNorms run over T (rq + rkv); rotary covers the query's rope part and the one
  shared rope key; scores are dqk = nope + rope wide, values dv.
Dense and MoE layers of one model differ only in the MLP (``ModelSpec.is_moe_layer``).
Units: elements for shapes, bytes for traffic; e bytes of one activation element (``Precision.activations``).
"""

from dataclasses import dataclass

from cost_models import kernels
from cost_models.activations import per_op_priced
from cost_models.compute import Gemm
from cost_models.context_parallel import local_seq_len
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    Kernels,
    Layout,
    ModelSpec,
    PositionEmbedding,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """Forward work of one layer, one micro-batch, one tensor-parallel rank."""

    dense_gemms: tuple[Gemm, ...]
    """Projections with weights (q/k/v, output, MLP or experts, router)."""
    attention_gemms: tuple[Gemm, ...]
    """Scores Q K^T and probabilities times V, batched over heads."""
    elementwise_bytes: float
    """Bytes moved by everything outside the attention core."""
    elementwise_kernels: int
    """Kernels launched for it (``cost_models.kernels``)."""
    attention_elementwise_bytes: float
    """Bytes moved by softmax and attention dropout (eager attention only)."""
    flash_attention: bool
    """Whether the attention core is one fused FlashAttention kernel."""
    mlp_gemms: tuple[Gemm, ...] = ()
    """Of ``dense_gemms``: the MLP's, or the MoE block's (router, routed and shared experts, the
    shared experts' gate): what recomputing the block (``RecomputeModule.MLP``, ``MOE``) runs again."""
    mlp_elementwise: kernels.Traffic = kernels.NONE
    """Of the elementwise traffic: the MLP's activation, or the MoE block's (routed and shared
    experts') activations and its permutation to the experts and back."""
    expert_activation: kernels.Traffic = kernels.NONE
    """Of ``mlp_elementwise``: the routed experts' activation (``RecomputeModule.MOE_ACT``)."""
    norms: kernels.Traffic = kernels.NONE
    """Of the elementwise traffic: the two norms (``RecomputeModule.LAYERNORM``)."""
    every_other_gemms: tuple[Gemm, ...] = ()
    """The matmuls torchtitan's per-op policy re-runs in the backward
    (``SelectiveRecompute.EVERY_OTHER_MATMUL``: the 2nd, 4th, ... of q, k, v, output, (gate, up,)
    down): k and the output projection, and the MLP's up (gated) or down projection; none in the
    layers it is not priced on (MoE, multi-head latent attention)."""


def expert_gemms(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[Gemm, Gemm]:
    """The routed experts' up and down projections on one rank of a balanced MoE layer, one
    micro-batch: the rank's E / ep experts batched, each seeing ep k s b / E tokens (its share of
    the group's routed pairs), split over t; with the experts folded, ep k s b / (t E) tokens
    (every rank routes s b / t) on whole experts: the same FLOPs, other shapes. A rank hotter
    than the mean (``expert_parallel.ExpertLoad``) scales their time."""
    t, h = layout.expert_tensor_degree, model.hidden_size
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    k, experts, f = model.num_experts_per_tok, model.num_local_experts, model.expert_ffn_size
    ep = layout.expert_parallel_degree
    routing = tokens // layout.tensor_parallel_degree if layout.folds_experts else tokens
    tokens_per_expert = max(1, routing * ep * k // experts)
    in_factor = 2 if model.hidden_act.gated else 1
    local = experts // ep
    return (
        Gemm(tokens_per_expert, in_factor * f // t, h, batch=local, grouped=True),
        Gemm(tokens_per_expert, h, f // t, batch=local, grouped=True),
    )


def layer_work(model: ModelSpec, training: TrainingSpec, layout: Layout, *, moe: bool | None = None) -> LayerWork:
    """Forward GEMMs and elementwise traffic of one transformer layer (see module docstring): its
    attention projections (``_attention_projections``), its MLP or MoE block (``_mlp_work``), the
    attention core, and the norms and residual adds around them.

    ``moe`` says which kind of layer (``ModelSpec.is_moe_layer``); None means the model's MoE
    layer if it has any, else its dense layer.
    """
    t, b, s = layout.tensor_parallel_degree, layout.micro_batch_size, training.seq_len
    h, e = model.hidden_size, training.precision.activations.bytes  # what the elementwise kernels move
    s_local = local_seq_len(training, layout)  # s / cp: the rank's queries; its keys are all s
    tokens = b * s_local
    seq_tokens = tokens // t if layout.sequence_parallel else tokens
    heads = model.num_attention_heads // t
    sparse = model.is_moe if moe is None else moe

    kinds, norm_kind = training.kernels, model.norm_type
    dense, attention_side, out_elements = _attention_projections(model, tokens, t, e, kinds)
    mlp = _mlp_work(model, training, layout, tokens, seq_tokens, sparse=sparse)
    dense += mlp.gemms

    attention = (
        Gemm(s_local, s, model.qk_head_size, batch=b * heads),
        Gemm(s_local, model.v_head_size, s, batch=b * heads),
    )

    dropout = model.hidden_dropout > 0
    norms = kernels.norm(norm_kind, seq_tokens * h, e, kinds)
    residual = kernels.residual_add(seq_tokens * h, e, dropout, kinds)
    elementwise = (
        norms
        + norms
        + residual
        + residual
        + mlp.activation
        + attention_side
        + mlp.permute
        + kernels.attention_output(out_elements, e, kinds)
    )

    flash = training.attention_kernel.fused
    scores = b * heads * s_local * s
    attn_mask = 1 if model.attention_dropout > 0 else 0
    alibi = 2 * e if model.position_embedding_type is PositionEmbedding.ALIBI else 0  # its bias, one more pass
    attention_bytes = 0.0 if flash else (2 * e + alibi + (2 * e + attn_mask if attn_mask else 0)) * scores
    return LayerWork(
        dense_gemms=tuple(dense),
        attention_gemms=attention,
        elementwise_bytes=elementwise.bytes,
        elementwise_kernels=elementwise.kernels,
        attention_elementwise_bytes=float(attention_bytes),
        flash_attention=flash,
        mlp_gemms=tuple(mlp.gemms),
        mlp_elementwise=mlp.activation + mlp.permute,
        expert_activation=mlp.routed_activation,
        norms=norms + norms,
        every_other_gemms=_every_other_gemms(model, tokens, t) if per_op_priced(model, moe=sparse) else (),
    )


def _every_other_gemms(model: ModelSpec, tokens: int, t: int) -> tuple[Gemm, ...]:
    """A dense layer's 2nd, 4th, ... matmuls in forward order (``LayerWork.every_other_gemms``)."""
    h, f = model.hidden_size, model.ffn_size
    q, kv = model.num_attention_heads * model.head_size, model.kv_heads * model.head_size
    mlp = Gemm(tokens, f // t, h) if model.hidden_act.gated else Gemm(tokens, h, f // t)
    return Gemm(tokens, kv // t, h), Gemm(tokens, h, q // t), mlp


def _attention_projections(
    model: ModelSpec, tokens: int, t: int, e: int, kinds: Kernels
) -> tuple[list[Gemm], kernels.Traffic, int]:
    """The attention block's projections on one tensor-parallel rank over ``tokens`` tokens, the
    elementwise traffic beside them (rotary, Qwen3's q/k norms; MLA's latent norms), and the
    elements of the attention core's output (what eager kernels copy back to token-major layout)."""
    if model.is_mla:
        heads = model.num_attention_heads // t
        return (
            _mla_gemms(model, tokens, t),
            _mla_elementwise(model, tokens, t, e, kinds),
            tokens * heads * model.v_head_size,
        )
    h, norm_kind = model.hidden_size, model.norm_type
    q_dim = model.num_attention_heads * model.head_size
    kv_dim = model.kv_heads * model.head_size
    dense = [Gemm(tokens, (q_dim + 2 * kv_dim) // t, h), Gemm(tokens, h, q_dim // t)]
    q_elements, k_elements = tokens * q_dim // t, tokens * kv_dim // t
    rope = model.position_embedding_type is PositionEmbedding.ROPE
    attention_side = kernels.rotary(q_elements, k_elements, e, kinds) if rope else kernels.NONE
    if model.qk_norm:
        attention_side += kernels.norm(norm_kind, q_elements, e, kinds) + kernels.norm(norm_kind, k_elements, e, kinds)
    return dense, attention_side, q_elements


@dataclass(frozen=True, slots=True, kw_only=True)
class _MlpWork:
    """One layer's MLP or MoE block on one tensor-parallel rank (``_mlp_work``)."""

    gemms: list[Gemm]
    """Its GEMMs: up and down projections; an MoE block's router, routed and shared experts and gate."""
    activation: kernels.Traffic
    """Its activations' traffic (routed and shared experts')."""
    routed_activation: kernels.Traffic
    """Of ``activation``: the routed experts' (none for a dense MLP)."""
    permute: kernels.Traffic
    """Permuting the routed tokens to their experts and back (none for a dense MLP)."""


def _mlp_work(
    model: ModelSpec, training: TrainingSpec, layout: Layout, tokens: int, seq_tokens: int, *, sparse: bool
) -> _MlpWork:
    """The MLP's GEMMs and elementwise traffic over the rank's ``tokens`` (``seq_tokens`` of them
    under sequence parallelism): a dense MLP split over t, or an MoE block whose routed experts
    see their share of the routed pairs (``expert_gemms``; with the experts folded, each rank
    routes its own ``seq_tokens``) and whose shared experts see every token, split over t."""
    t, h, e, kinds = (
        layout.tensor_parallel_degree,
        model.hidden_size,
        training.precision.activations.bytes,
        training.kernels,
    )
    gated = model.hidden_act.gated
    in_factor = 2 if gated else 1
    mlp: list[Gemm]
    if sparse:
        k, f, etp = model.num_experts_per_tok, model.expert_ffn_size, layout.expert_tensor_degree
        routing = seq_tokens if layout.folds_experts else tokens  # folded: each rank routes its own share
        mlp = [Gemm(routing, model.num_local_experts, h, linear=False), *expert_gemms(model, training, layout)]
        routed_tokens = routing * k
        act = routed_act = kernels.activation(gated, routed_tokens * (f // etp), e, kinds)
        shared = model.shared_ffn_size
        if shared:  # every token passes through the shared experts, split over t as a dense MLP
            mlp += [Gemm(tokens, in_factor * shared // t, h), Gemm(tokens, h, shared // t)]
            act += kernels.activation(gated, tokens * (shared // t), e, kinds)
        if model.has_shared_expert_gate:
            mlp.append(Gemm(tokens, 1, h, linear=False))
        permute = kernels.Traffic(2.0 * 2 * routed_tokens * h * e, 2)
    else:
        f = model.ffn_size
        mlp = [Gemm(tokens, in_factor * f // t, h), Gemm(tokens, h, f // t)]
        act = kernels.activation(gated, tokens * (f // t), e, kinds)
        permute = routed_act = kernels.NONE
    return _MlpWork(gemms=mlp, activation=act, routed_activation=routed_act, permute=permute)


def _mla_gemms(model: ModelSpec, tokens: int, t: int) -> list[Gemm]:
    """MLA's projections as Megatron-Core splits them: the down-projections (q_a, kv_a) whole on
    every tensor-parallel rank, the up-projections (q_b, kv_b) by heads, o by rows."""
    h, a = model.hidden_size, model.num_attention_heads
    rq, rkv, rope = model.q_lora_rank, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    q_out = a * model.qk_head_size // t
    query = [Gemm(tokens, q_out, h)] if rq is None else [Gemm(tokens, rq, h), Gemm(tokens, q_out, rq)]
    kv_up = a * ((model.qk_nope_head_dim or 0) + model.v_head_size) // t
    return [
        *query,
        Gemm(tokens, rkv + rope, h),
        Gemm(tokens, kv_up, rkv),
        Gemm(tokens, h, a * model.v_head_size // t),
    ]


def _mla_elementwise(model: ModelSpec, tokens: int, t: int, e: int, kinds: Kernels) -> kernels.Traffic:
    """MLA's two latent RMSNorms (over rq + rkv per token) and rotary embedding of the query's
    rope part (a/t heads) and the one shared rope key."""
    rq, rkv, rope = model.q_lora_rank or 0, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    norms = kernels.norm(model.norm_type, tokens * rq, e, kinds) + kernels.norm(model.norm_type, tokens * rkv, e, kinds)
    return norms + kernels.rotary(tokens * (model.num_attention_heads // t) * rope, tokens * rope, e, kinds)


def attention_macs_per_token(model: ModelSpec) -> int:
    """Multiply-accumulates of one layer's attention projections for one token (weights only)."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        rq, rkv, rope = model.q_lora_rank, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
        q_dim = a * model.qk_head_size
        query = h * q_dim if rq is None else h * rq + rq * q_dim
        kv = h * (rkv + rope) + rkv * a * ((model.qk_nope_head_dim or 0) + model.v_head_size)
        return query + kv + a * model.v_head_size * h
    q_dim, kv_dim = a * model.head_size, model.kv_heads * model.head_size
    return h * (q_dim + 2 * kv_dim) + q_dim * h


def mlp_macs_per_token(model: ModelSpec, *, moe: bool) -> int:
    """Multiply-accumulates of one layer's MLP for one token: the dense MLP, or the top-k routed
    experts, the shared experts (and their gate) and the router."""
    h, matrices = model.hidden_size, 3 if model.hidden_act.gated else 2
    if not moe:
        return matrices * h * model.ffn_size
    routed = matrices * h * model.expert_ffn_size * model.num_experts_per_tok
    shared = matrices * h * model.shared_ffn_size + (h if model.has_shared_expert_gate else 0)
    return routed + shared + h * model.num_local_experts


def attention_core_flops_per_sequence(model: ModelSpec, seq_len: int) -> int:
    """Forward FLOPs of one layer's Q K^T and probabilities x V over the full s x s."""
    return 2 * seq_len * seq_len * model.num_attention_heads * (model.qk_head_size + model.v_head_size)


def output_layer_gemm(model: ModelSpec, training: TrainingSpec, layout: Layout) -> Gemm:
    """Logits: (b s/cp x h) @ (h x V/t), the vocabulary split over the tensor-parallel group."""
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    return Gemm(tokens, -(-model.vocab_size // layout.tensor_parallel_degree), model.hidden_size)


def output_layer_elementwise(model: ModelSpec, training: TrainingSpec, layout: Layout) -> kernels.Traffic:
    """The final norm and the cross-entropy over the rank's logits (``kernels.cross_entropy``, run
    as ``TrainingSpec.loss_kernels`` says), forward and backward."""
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    logits = tokens * -(-model.vocab_size // layout.tensor_parallel_degree)
    act = training.precision.activations.bytes
    norm = kernels.norm(model.norm_type, tokens * model.hidden_size, act, training.kernels)
    loss_kinds = training.kernels if training.loss_kernels is None else training.loss_kernels
    return kernels.cross_entropy(logits, act, loss_kinds) + norm + norm + norm


def embedding_elementwise_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Embedding lookup (and position add, dropout): write, read, write b s h e (e the bytes of
    ``Precision.activations``)."""
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    return 3.0 * tokens * model.hidden_size * training.precision.activations.bytes


def model_flops_per_sequence(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of forward + backward for one sequence, no recomputation.

    3 x forward FLOPs of every GEMM (dense and attention, attention over the full s x s as
    Narayanan et al. and Korthikanti et al. count it; MoE layers count only the top-k routed
    experts, plus the shared experts and the router; dense layers of an MoE model their MLP).
    For a GPT block this is 72 s l h^2 (1 + s/(6h) + V/(12 h l)) per sequence (Korthikanti et
    al. 2022, appendix).
    """
    h, s = model.hidden_size, seq_len
    attention = attention_macs_per_token(model)
    core = attention_core_flops_per_sequence(model, s)
    moe_layers = model.num_moe_layers
    dense_layers = model.num_hidden_layers - moe_layers
    dense_layer = 2 * (attention + mlp_macs_per_token(model, moe=False)) * s + core
    moe_layer = 2 * (attention + mlp_macs_per_token(model, moe=True)) * s + core if moe_layers else 0
    logits = 2 * s * h * model.vocab_size
    return 3.0 * (dense_layers * dense_layer + moe_layers * moe_layer + logits)


PROFILED_TENSOR_PARALLEL = (1, 2, 4, 8)
"""Tensor-parallel degrees whose GEMM shapes ``planner profile --model`` times."""
PROFILED_MICRO_BATCHES = (1, 2)
"""Micro-batch sizes whose GEMM shapes ``planner profile --model`` times."""


def hardware_flop_ratio(
    model: ModelSpec,
    seq_len: int,
    recompute: Recompute,
    modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES,
) -> float:
    """Hardware FLOPs / model FLOPs of one training step.

    Full recompute adds one forward of every transformer layer (Narayanan et al. eq. 3: 96 vs
    72 B s l h^2); selective adds the forward of the modules it recomputes: the attention core's
    (core_attn), the dense layers' MLPs (mlp), the MoE layers' blocks (moe); the norms and the
    experts' activation (layernorm, moe_act) are elementwise, no FLOPs counted; none adds nothing.

    Args:
        model: the model.
        seq_len: tokens per sequence.
        recompute: what the backward recomputes.
        modules: what selective recompute re-runs (``Layout.recompute_modules``).

    Returns:
        The ratio, >= 1.
    """
    if recompute is Recompute.NONE:
        return 1.0
    h, s, l = model.hidden_size, seq_len, model.num_hidden_layers
    per_seq = model_flops_per_sequence(model, s)
    logits = 3 * 2 * s * h * model.vocab_size
    layer_fwd = (per_seq - logits) / 3
    if recompute is Recompute.FULL:
        return (per_seq + layer_fwd) / per_seq
    again = 0.0
    if RecomputeModule.CORE_ATTN in modules:
        again += l * attention_core_flops_per_sequence(model, s)
    moe_layers = model.num_moe_layers
    if RecomputeModule.MLP in modules:
        again += (l - moe_layers) * 2 * mlp_macs_per_token(model, moe=False) * s
    if RecomputeModule.MOE in modules:
        again += moe_layers * 2 * mlp_macs_per_token(model, moe=True) * s
    return (per_seq + again) / per_seq


def profile_gemm_shapes(model: ModelSpec, seq_len: int, max_tensor_parallel: int) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of the model's layer and output-layer GEMMs, forward and backward, at the
    tensor-parallel degrees (up to ``max_tensor_parallel``) and micro-batches plans use: the
    shapes the profiler times so that the compute model reads measured GEMMs."""
    training = TrainingSpec(global_batch_size=1, seq_len=seq_len)
    shapes = set()
    for tp in PROFILED_TENSOR_PARALLEL:
        if tp > max_tensor_parallel or model.num_attention_heads % tp:
            continue
        for mb in PROFILED_MICRO_BATCHES:
            layout = Layout(
                data_parallel_degree=1, tensor_parallel_degree=tp, pipeline_parallel_degree=1, micro_batch_size=mb
            )
            kinds = {model.is_moe_layer(i) for i in range(model.num_hidden_layers)}
            gemms = [g for moe in sorted(kinds) for g in layer_work(model, training, layout, moe=moe).dense_gemms]
            for g in (*gemms, output_layer_gemm(model, training, layout)):
                for shape in (g, *g.backward()):
                    shapes.add((shape.m, shape.n, shape.k))
    return tuple(sorted(shapes))
