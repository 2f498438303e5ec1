"""Activation memory of a decoder transformer, term by term, in bytes.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", sec. 4.1 (per-layer accounting), Table 2 (parallel and recompute variants) and
sec. 4.3 (embedding and output layer); Megatron-LM ``megatron/training/theoretical_memory_usage.py``
for the embedding input ids and the output layer. For a GPT block (LayerNorm, 4h GELU MLP,
multi-head attention, dropout > 0, 2-byte activations) the per-layer total is exactly
s b h (34 + 5 a s / h), s b h (10 + 24/t + 5 a s / (h t)) with tensor parallelism and
s b h (34/t + 5 a s / (h t)) with tensor + sequence parallelism.

Notation: s sequence length, b micro-batch size, h hidden size, a query heads, q = a * head_dim,
k_v = kv_heads * head_dim, f MLP width, E experts, k experts per token, t tensor-parallel degree,
``act`` bytes of one activation element (``Precision.activations``: 2 for bf16/fp16, 4 for fp32);
``/t`` = split over tensor parallelism, ``/sp`` = split by t only with sequence parallelism,
replicated otherwise.
Dropout masks are 1 byte per element in every precision. Everything is per rank, per micro-batch, in bytes.
"""

import functools
from dataclasses import dataclass
from typing import Final

from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    Activation,
    AttentionKernel,
    DType,
    ModelSpec,
    Recompute,
    RecomputeModule,
    SelectiveRecompute,
)

MASK_BYTES = 1
"""One dropout-mask element (PyTorch keeps a bool/uint8 mask)."""
TOKEN_ID_BYTES = 8
"""One input token id (int64), kept by the embedding for its backward."""
ROUTER_ELEMENT_BYTES = 4
"""Router logits/probabilities are computed in fp32 (Megatron-Core router, HF Mixtral)."""
LOGIT_ELEMENT_BYTES = 4
"""Logits are cast to fp32 for the softmax cross-entropy (Megatron-LM vocab-parallel loss)."""
SOFTMAX_STAT_BYTES = 4
"""FlashAttention keeps one fp32 log-sum-exp per query head and token for its backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """Bytes one transformer layer keeps for its backward, one micro-batch, one rank, no recompute."""

    norm_inputs_bytes: float
    """Inputs of the two norms (LayerNorm and RMSNorm both keep their input); the first is the layer input."""
    attention_bytes: float
    """QKV input, Q, K, V, output-projection input, dropout mask after attention."""
    attention_scores_bytes: float
    """Eager: softmax output, its dropout mask and the dropout output (the a s^2 b terms);
    FlashAttention: its fp32 log-sum-exp. Recomputing the attention core (core_attn) drops this group."""
    mlp_bytes: float
    """MLP (or MoE) input(s), intermediates, router and dropout mask after the MLP."""
    moe: bool = False
    """Whether the layer's MLP is a mixture of experts."""
    norm_outputs_bytes: float = 0.0
    """Of ``attention_bytes`` and ``mlp_bytes``: the two norms' outputs, the QKV (MLA: down-)
    projection's input and the MLP's (router's) input, half each: what layernorm recompute drops."""
    mlp_block_bytes: float = 0.0
    """Of ``mlp_bytes``: what the MLP (MoE) block keeps beyond its input and the dropout mask after
    it (intermediates; router logits, routed copies, shared experts): what mlp (moe) recompute drops."""
    expert_activation_bytes: float = 0.0
    """Of ``mlp_block_bytes``: the routed experts' activation outputs (the down projections'
    inputs), one act s b f/t per routed copy: what moe_act recompute drops."""
    every_other_matmul_bytes: float | None = None
    """What torchtitan's per-op policy keeps of the layer (``SelectiveRecompute.EVERY_OTHER_MATMUL``:
    ``_every_other_matmul_bytes``); None for the layers it is not priced on (MoE, multi-head
    latent attention), which keep what the modules do."""

    @property
    def layer_input_bytes(self) -> float:
        """The first norm's input, the only tensor full recomputation keeps."""
        return self.norm_inputs_bytes / 2

    @property
    def total_bytes(self) -> float:
        """All terms: what the layer keeps without recomputation."""
        return self.norm_inputs_bytes + self.attention_bytes + self.attention_scores_bytes + self.mlp_bytes


@functools.lru_cache(maxsize=1024)
def layer_activations(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    activation_dtype: DType,
    tensor_parallel_degree: int = 1,
    sequence_parallel: bool = False,
    attention_kernel: AttentionKernel = AttentionKernel.EAGER,
    moe: bool | None = None,
    expert_load: float = 1.0,
    context_parallel_degree: int = 1,
    kv_replication: int = 1,
    fp8_inputs: bool = False,
) -> LayerActivations:
    """Activations of one transformer layer by term (Korthikanti et al. 2022, sec. 4.1, generalized):
    the attention block's (``_attention_bytes``; multi-head latent attention's
    ``_mla_attention_bytes``), its scores (``_attention_scores_bytes``), the MLP block's
    (``_mlp_bytes``), and the norms': each of the two keeps its input, act s b h /sp (LayerNorm
    and RMSNorm alike).

    Args:
        model: the transformer's shape and dropout rates.
        seq_len: tokens per sequence (s).
        micro_batch_size: sequences per micro-batch (b).
        activation_dtype: what the kept tensors are in (``Precision.activations``); fp32 doubles
            the 2-byte terms, masks stay 1 byte.
        tensor_parallel_degree: t.
        sequence_parallel: whether norm/dropout regions are split along the sequence over t.
        attention_kernel: eager (Korthikanti's accounting, the default) or FlashAttention.
        moe: which kind of layer (``ModelSpec.is_moe_layer``); None means the model's MoE layer
            if it has any, else its dense layer.
        expert_load: the rank's routed copies over a balanced rank's k s b (a hot rank's
            ``expert_parallel.ExpertLoad.compute_factor``); scales the routed experts' terms.
        context_parallel_degree: cp: the rank keeps its s / cp tokens of every sequence, so
            every term above holds with s / cp for s, but for the eager scores, a (s/cp) s b /t
            (its queries against all keys). The k/v blocks the ring passes are transient
            (``context_parallel.ring_buffer_bytes``).
        kv_replication: copies of each key/value head the attention core keeps (the all-to-all
            kind of context parallelism hands out repeated kv heads where cp does not divide a
            tensor-parallel rank's, ``context_parallel.kv_replication``): K and V scale by it.
        fp8_inputs: the linear layers keep their inputs for the backward in FP8, one byte an
            element (Transformer Engine under an FP8 recipe: ``RecipeRun.saves_fp8_inputs``;
            references-fp8 §1.3): the QKV (MLA: down- and up-projection) and MLP inputs and the
            down projections' inputs; a linear input another op also keeps in the high
            precision is kept twice (the output projection's, which the attention kernel keeps
            as its output; the shared experts', which the bf16 router keeps).

    Returns:
        The layer's activations by group, in bytes, before any recomputation. Memoized (the
        inputs are immutable): every stage of every layout a search checks asks for it.
    """
    act, t = activation_dtype.bytes, tensor_parallel_degree
    sp = t if sequence_parallel else 1
    local = seq_len // context_parallel_degree
    tokens = local * micro_batch_size
    h = model.hidden_size
    hidden_mask = MASK_BYTES * tokens * h / sp if model.hidden_dropout > 0 else 0.0
    fp8 = DType.FP8.bytes if fp8_inputs else 0
    rank = _RankShape(act=act, tokens=tokens, t=t, sp=sp, hidden_mask=hidden_mask, linear_in=fp8 or act, fp8_copy=fp8)
    attention = (
        _mla_attention_bytes(model, rank, kv_replication)
        if model.is_mla
        else _attention_bytes(model, rank, kv_replication)
    )
    scores = _attention_scores_bytes(model, rank, attention_kernel, local * seq_len * micro_batch_size)
    sparse = model.is_moe if moe is None else moe
    mlp, expert_activations = _mlp_bytes(model, rank, sparse, expert_load)
    mlp_input = (act if sparse else rank.linear_in) * tokens * h / sp  # the second norm's output (router's: bf16)
    op_policy = _every_other_matmul_bytes(model, rank) + scores if per_op_priced(model, moe=sparse) else None
    return LayerActivations(
        norm_inputs_bytes=2 * act * tokens * h / sp,
        attention_bytes=attention,
        attention_scores_bytes=scores,
        mlp_bytes=mlp,
        moe=sparse,
        norm_outputs_bytes=rank.linear_in * tokens * h / sp + mlp_input,  # the QKV (down-projection) input, the MLP's
        mlp_block_bytes=mlp - mlp_input - hidden_mask,
        expert_activation_bytes=expert_activations,
        every_other_matmul_bytes=op_policy,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _RankShape:
    """What every term of ``layer_activations`` is priced over on one rank, one micro-batch."""

    act: int
    """Bytes of one activation element."""
    tokens: int
    """The rank's tokens of the micro-batch: b s / cp."""
    t: int
    """Tensor-parallel degree: what ``/t`` terms are split over."""
    sp: int
    """t with sequence parallelism, else 1: what ``/sp`` terms are split over."""
    hidden_mask: float
    """One dropout mask after attention or the MLP, 1 s b h /sp (0 without hidden dropout)."""
    linear_in: int
    """Bytes of one element of a linear layer's saved input: ``act``, or 1 where the library
    saves it in FP8 (``layer_activations``' ``fp8_inputs``)."""
    fp8_copy: int
    """Bytes of one element of the FP8 copy such a library keeps of an input that another op
    keeps in ``act`` too: 0 without FP8 inputs."""


def _attention_bytes(model: ModelSpec, rank: _RankShape, kv_replication: int) -> float:
    """The attention block's bytes beyond its scores (``_attention_scores_bytes``):
      - QKV-projection input ................ act s b h /sp
      - Q and K (inputs of Q K^T) ........... act s b (q + k_v) /t    (GQA: K is k_v wide)
      - V ................................... act s b k_v /t
      - output-projection input ............. act s b q /t
      - dropout mask after attention ........ 1 s b h /sp             (hidden_dropout > 0)
    Qwen3's q/k norms keep their inputs: act s b (q + k_v) /t more. K and V scale by
    ``kv_replication`` (``layer_activations``)."""
    act, tokens, t, sp = rank.act, rank.tokens, rank.t, rank.sp
    h, a = model.hidden_size, model.num_attention_heads
    q, kv = a * model.head_size, model.kv_heads * model.head_size
    attention = (
        rank.linear_in * tokens * h / sp  # QKV-projection input
        + act * tokens * (q + kv * kv_replication) / t  # Q and K
        + act * tokens * kv * kv_replication / t  # V
        + (act + rank.fp8_copy) * tokens * q / t  # output-projection input (the attention's output)
        + rank.hidden_mask
    )
    if model.qk_norm:
        attention += act * tokens * (q + kv) / t
    return attention


def _mla_attention_bytes(model: ModelSpec, rank: _RankShape, kv_replication: int) -> float:
    """Multi-head latent attention's (DeepSeek) block, beyond its scores: it replaces Q, K, V of
    ``_attention_bytes`` by the latent down-projection outputs (each its RMSNorm's input) and the
    normalized latents (the up-projections' inputs), 2 act s b (rq + rkv), and the rope key,
    act s b dr, all whole on every rank; Q and K, 2 act s b a dqk /t; V and the output-projection
    input, 2 act s b a dv /t; beside the down-projection input, act s b h /sp, and the dropout
    mask after attention."""
    act, tokens, t, sp = rank.act, rank.tokens, rank.t, rank.sp
    h, a = model.hidden_size, model.num_attention_heads
    qk, v = a * model.qk_head_size, a * model.v_head_size
    rq, rkv, rope = model.q_lora_rank or 0, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    return (
        rank.linear_in * tokens * h / sp  # down-projection input
        + act * tokens * (rq + rkv + rope)  # latents before their norms, rope key
        + rank.linear_in * tokens * (rq + rkv)  # the normalized latents: the up-projections' inputs
        + act * tokens * qk * (1 + kv_replication) / t  # Q and K
        + (act * (kv_replication + 1) + rank.fp8_copy) * tokens * v / t  # V and the output-projection input
        + rank.hidden_mask
    )


def _attention_scores_bytes(
    model: ModelSpec, rank: _RankShape, attention_kernel: AttentionKernel, query_key_pairs: int
) -> float:
    """The attention core's score terms, over the rank's ``query_key_pairs`` (its s / cp queries
    against all s keys, times b):
      - softmax output ...................... act a s^2 b /t
      - softmax dropout mask ................ 1 a s^2 b /t            (attention_dropout > 0)
      - dropout output (input of scores @ V)  act a s^2 b /t          (attention_dropout > 0; without
        dropout the softmax output itself feeds scores @ V and is not stored twice)
      - with FlashAttention (``AttentionKernel.FLASH``) the three s^2 terms above are replaced
        by the fp32 log-sum-exp, 4 a s b /t: the kernel recomputes the scores in its backward
        and regenerates the dropout mask from the saved RNG state (Dao 2023, FlashAttention-2)"""
    a, act, t = model.num_attention_heads, rank.act, rank.t
    if attention_kernel.fused:
        return SOFTMAX_STAT_BYTES * a * rank.tokens / t  # log-sum-exp; the dropout mask is regenerated
    scores_elements = a * query_key_pairs / t
    scores = act * scores_elements  # softmax output
    if model.attention_dropout > 0:
        scores += MASK_BYTES * scores_elements + act * scores_elements  # mask, dropout output
    return scores


def _mlp_bytes(model: ModelSpec, rank: _RankShape, sparse: bool, expert_load: float) -> tuple[float, float]:
    """The MLP block's bytes, and of them the routed experts' activation outputs (0 when dense).

    MLP block, dense:
      - MLP input ........................... act s b h /sp
      - GELU-type: activation input and output, 2 x act s b f /t
      - gated (SwiGLU): gate and up projection outputs (the inputs of a fused SwiGLU, whose
        backward recomputes SiLU, as Megatron-Core's ``SwiGLUFunction``) and their product
        (the down-projection input), 3 x act s b f /t. An unfused eager implementation also
        keeps SiLU(gate): one more act s b f /t, not counted.
      - dropout mask after the MLP .......... 1 s b h /sp             (hidden_dropout > 0)
    MLP block, MoE (balanced routing, capacity factor 1, so a rank's experts see s b k tokens):
      - router input ........................ act s b h /sp
      - router logits ....................... 4 s b E /sp            (fp32)
      - per routed copy (x k): expert input act s b h /sp, intermediates as dense (expert width),
        expert output (kept by the probability-weighted combine) act s b h /sp
      - shared experts (every token): intermediates as dense at their width; with Qwen2-MoE's
        sigmoid gate also the shared output act s b h /sp and the gate value act s b
      - dropout mask after the MLP .......... 1 s b h /sp
      With the experts whole on each rank (expert tensor parallelism 1, which needs sequence
      parallelism) a rank routes its own s b / t tokens and keeps k s b / t routed copies at the
      whole expert width: the same bytes as k s b copies at width /t, so the terms above hold.
    The routed experts' terms scale by ``expert_load`` (``layer_activations``)."""
    act, tokens, t, sp, h = rank.act, rank.tokens, rank.t, rank.sp, model.hidden_size
    if not sparse:
        intermediates = _intermediates_bytes(model, rank, model.ffn_size)
        return rank.linear_in * tokens * h / sp + intermediates + rank.hidden_mask, 0.0
    k = model.num_experts_per_tok
    router = act * tokens * h / sp + ROUTER_ELEMENT_BYTES * tokens * model.num_local_experts / sp  # a bf16 linear
    copies = (rank.linear_in + act) * tokens * h / sp  # each copy's expert input and output
    routed = expert_load * k * (copies + _intermediates_bytes(model, rank, model.expert_ffn_size))
    expert_activations = expert_load * k * rank.linear_in * tokens * model.expert_ffn_size / t
    mlp = router + routed + rank.hidden_mask
    if model.shared_ffn_size:  # its input is the router's, kept in bf16 there
        mlp += _intermediates_bytes(model, rank, model.shared_ffn_size) + rank.fp8_copy * tokens * h / sp
    if model.has_shared_expert_gate:
        mlp += act * tokens * h / sp + act * tokens
    return mlp, expert_activations


def _intermediates_bytes(model: ModelSpec, rank: _RankShape, width: int) -> float:
    """An MLP's intermediates at ``width``: 3 tensors of it for a gated activation, 2 otherwise,
    the last (the down projection's input) in ``_RankShape.linear_in``."""
    kept = 2 if model.hidden_act.gated else 1
    return (kept * rank.act + rank.linear_in) * rank.tokens * width / rank.t


def per_op_priced(model: ModelSpec, *, moe: bool) -> bool:
    """Whether torchtitan's per-op policy (``SelectiveRecompute.EVERY_OTHER_MATMUL``) is priced on
    the model's dense (``moe`` False) or MoE layers: on dense layers with q, k and v projections
    apart; an MoE or multi-head latent attention layer is priced as Megatron-Core's modules."""
    return not moe and not model.is_mla


def _every_other_matmul_bytes(model: ModelSpec, rank: _RankShape) -> float:
    """What torchtitan's per-op policy keeps of a dense layer beyond the attention kernel's
    statistics (``_attention_scores_bytes``), all in ``act`` (its FP8 linear layers priced as bf16's:
    torchao's ``_scaled_mm`` is not on the policy's list, but torchtitan's 2024-12 table measured its
    FP8 row's peak with selective recompute at its bf16 compiled row's, 76.8 against 77.0 GiB):
      - the layer's input (the checkpoint's) ................ act s b h /sp
      - the attention kernel's output ...................... act s b q /t
      - the 1st, 3rd, ... matmul outputs of q, k, v, output, (gate, up,) down in forward order:
        q and v (act s b (q + k_v) /t); gated, the gate's and the down projection's, the latter
        whole before its reduction (act s b f /t + act s b h); else the up projection's, act s b f /t
      - each reduce-scatter's output under sequence parallelism, 2 act s b h /t
    Source: torchtitan's ``_op_sac_save_list`` (aten.mm, the SDPA kernels, reduce_scatter_tensor,
    max) and its policy that recomputes every second aten.mm of a layer."""
    act, tokens, t, h = rank.act, rank.tokens, rank.t, model.hidden_size
    q, kv, f = model.num_attention_heads * model.head_size, model.kv_heads * model.head_size, model.ffn_size
    widths = [q / t, kv / t, kv / t, h]  # the attention's matmul outputs; the output projection's whole
    widths += [f / t, f / t, h] if model.hidden_act.gated else [f / t, h]
    kept = h / rank.sp + q / t + sum(widths[::2])  # input, attention output, the odd matmuls' outputs
    if rank.sp > 1:
        kept += 2 * h / t
    return act * tokens * kept


def kept_bytes(
    terms: LayerActivations,
    recompute: Recompute,
    modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES,
    selective: SelectiveRecompute = SelectiveRecompute.MODULES,
) -> float:
    """Bytes one layer keeps between its forward and backward, one micro-batch (Korthikanti Table 2).

    No recompute keeps every term of ``layer_activations``; full recompute keeps only the layer
    input, act s b h, split over t with sequence parallelism; selective recompute drops what its
    ``modules`` rebuild in the backward (``dropped_bytes``); by default the attention-score terms
    (core_attn: 5 a s^2 b for an eager GPT block). Under torchtitan's per-op policy
    (``selective``) it keeps ``every_other_matmul_bytes`` where the layer has them.

    Args:
        terms: the layer's activations (``layer_activations``).
        recompute: none, selective or full.
        modules: what selective recompute re-runs (``Layout.recompute_modules``).
        selective: how the stack runs selective recompute (``TrainingSpec.selective_recompute``).
    """
    if recompute is Recompute.FULL:
        return terms.layer_input_bytes
    if recompute is Recompute.SELECTIVE:
        if selective is SelectiveRecompute.EVERY_OTHER_MATMUL and terms.every_other_matmul_bytes is not None:
            return terms.every_other_matmul_bytes
        attention, mlp = dropped_bytes(terms, modules)
        return terms.total_bytes - attention - mlp
    return terms.total_bytes


def dropped_bytes(terms: LayerActivations, modules: tuple[RecomputeModule, ...]) -> tuple[float, float]:
    """What selective recomputation of ``modules`` drops of one layer, (attention side, MLP side),
    in bytes (the modules as Megatron-Core's ``--recompute-modules`` runs them: ``RecomputeModule``):

    - core_attn: the attention-score terms (``attention_scores_bytes``); its inputs Q, K, V are
      the checkpoint's inputs and stay;
    - layernorm: each norm's output, act s b h /sp (``norm_outputs_bytes``, half a side each); the
      norms' inputs stay (the residual stream);
    - moe_act (MoE layers): the routed experts' activation outputs, act s b f /t per routed copy
      (``expert_activation_bytes``); the up projections' outputs, the activation's inputs, stay;
    - moe (MoE layers), mlp (dense layers): the block's every term but its input
      (``mlp_block_bytes``, which holds moe_act's); the dropout mask after it stays (Megatron's
      bias-dropout-add is outside the block).
    """
    has = set(modules)
    half_norms = terms.norm_outputs_bytes / 2 if RecomputeModule.LAYERNORM in has else 0.0
    attention = half_norms + (terms.attention_scores_bytes if RecomputeModule.CORE_ATTN in has else 0.0)
    block = RecomputeModule.MOE if terms.moe else RecomputeModule.MLP
    if block in has:
        mlp = terms.mlp_block_bytes
    elif terms.moe and RecomputeModule.MOE_ACT in has:
        mlp = terms.expert_activation_bytes
    else:
        mlp = 0.0
    return attention, half_norms + mlp


def rematerialized_bytes(
    terms: LayerActivations,
    recompute: Recompute,
    modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES,
    selective: SelectiveRecompute = SelectiveRecompute.MODULES,
) -> float:
    """Transient bytes rebuilt while one layer runs its backward under recomputation.

    Recomputation re-runs one layer's forward (full) or its recomputed modules (selective) just
    before that layer's backward needs them, so one layer's dropped terms of one micro-batch live at once
    on top of what ``kept_bytes`` keeps (checkpointing rematerializes one segment
    at a time: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; here a
    segment is one layer, as Megatron-LM's uniform recompute with one layer per checkpoint).
    Selective: the larger side of ``dropped_bytes``, the MLP's being rebuilt and freed by its
    backward before attention's is rebuilt; under torchtitan's per-op policy (``selective``)
    everything it does not keep, rebuilt at the layer's first saved tensor its backward reads.
    Zero without recompute.
    """
    if recompute is Recompute.NONE:
        return 0.0
    if recompute is Recompute.SELECTIVE:
        if selective is SelectiveRecompute.EVERY_OTHER_MATMUL and terms.every_other_matmul_bytes is not None:
            return max(0.0, terms.total_bytes - terms.every_other_matmul_bytes)
        return max(dropped_bytes(terms, modules))
    return terms.total_bytes - terms.layer_input_bytes


MLP_BACKWARD_TENSORS: Final = {Activation.SWIGLU: 6, Activation.GEGLU: 7, Activation.GELU: 2}
"""Tensors of an MLP's intermediate size that its backward holds at once, beyond what the layer
keeps, in the runtime's kernels (``runtime.kernels``, ``runtime.mlp.MLP``; the count as traced:
``tests/runtime/test_mlp_backward_memory.py``). GELU: the down projection's input gradient and
``gelu_backward``'s output. SwiGLU (``swiglu``, which keeps gate and up and recomputes SiLU):
that gradient, the sigmoid, the up gradient and three temporaries of the gate gradient's
product. GeGLU (``geglu``, tanh GELU): one more, the tanh. A backward fused into one kernel
(Megatron-Core's ``bias_swiglu_impl``) would hold three (the incoming gradient and the two it
writes): these counts bound it."""


def mlp_backward_bytes(model: ModelSpec, elements: float, activation_dtype: DType) -> float:
    """Transient bytes one MLP's backward holds beyond what its layer keeps (``MLP_BACKWARD_TENSORS``),
    for an MLP whose intermediate tensors have ``elements`` elements each (its tokens x width / t;
    a routed expert's: the tokens routed to it). They live while that MLP runs its backward,
    beside every activation the rank holds then.

    Args:
        model: the MLP's activation (``hidden_act``; SwiGLU for any other gated one, GELU for any
            ungated one, as the runtime runs them).
        elements: elements of one intermediate tensor.
        activation_dtype: what those tensors are in (``Precision.activations``).
    """
    act = model.hidden_act
    kind = act if act is Activation.GEGLU else Activation.SWIGLU if act.gated else Activation.GELU
    return MLP_BACKWARD_TENSORS[kind] * activation_dtype.bytes * elements


def embedding_activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    tensor_parallel_degree: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Bytes the input embedding keeps for its backward, one micro-batch (Korthikanti sec. 4.3).

    Terms (as Megatron-LM's ``theoretical_memory_usage.py``): the int64 token ids, 8 s b (every
    tensor-parallel rank looks up the full sequence in its vocabulary shard), and the embedding
    dropout mask, 1 s b h, split over t with sequence parallelism (hidden_dropout > 0 only). The
    embedding output itself is not kept: its backward needs only the ids, the dropout's only the
    mask, and the tensor entering the first layer is that layer's first norm input.
    """
    tokens = seq_len * micro_batch_size
    sp = tensor_parallel_degree if sequence_parallel else 1
    mask = MASK_BYTES * tokens * model.hidden_size / sp if model.hidden_dropout > 0 else 0.0
    return TOKEN_ID_BYTES * tokens + mask


def output_layer_activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    activation_dtype: DType,
    tensor_parallel_degree: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Bytes the final norm and the output projection keep, one micro-batch (Korthikanti sec. 4.3).

    The final norm's input and the output projection's input, act s b h each (act the bytes of
    ``activation_dtype``, ``Precision.activations``), split over t with sequence parallelism
    (Megatron's column-parallel linear keeps the sequence-sharded input and gathers it again in
    the backward). The logits are ``logits_bytes``.
    """
    sp = tensor_parallel_degree if sequence_parallel else 1
    return 2 * activation_dtype.bytes * seq_len * micro_batch_size * model.hidden_size / sp


def logits_bytes(model: ModelSpec, *, seq_len: int, micro_batch_size: int, tensor_parallel_degree: int = 1) -> float:
    """One fp32 copy of one micro-batch's logits on one rank: 4 s b V / t bytes.

    The output projection is vocabulary-parallel, so each rank holds V / t columns; the
    cross-entropy runs in fp32 (Megatron-LM ``vocab_parallel_cross_entropy``).
    """
    return LOGIT_ELEMENT_BYTES * seq_len * micro_batch_size * model.vocab_size / tensor_parallel_degree
