"""The work of one transformer layer (and of the embedding and output layers) for one
micro-batch on one tensor-parallel rank: its GEMMs and the bytes its elementwise kernels move.

GEMM shapes follow Megatron-LM's tensor parallelism (Shoeybi et al. 2019): q/k/v and the MLP
up-projections are split by columns, the output and down projections by rows, attention heads
by t. Elementwise traffic is counted kernel by kernel (forward; the backward moves about
twice as much), with T = b s tokens, e bytes per element, T' = T / t under sequence parallel:
- two norms: read and write T' h e each;
- two bias-dropout-residual adds: read 2, write 1 T' h e each, plus a 1-byte mask with dropout;
- MLP activation: GELU reads and writes T f/t e; SwiGLU reads 2 and writes 1 T f/t e;
- rotary embedding: reads and writes the q and k slices;
- eager attention: scale-mask-softmax reads and writes b (a/t) s^2 e, attention dropout reads
  and writes it again plus a 1-byte mask; FlashAttention keeps scores on chip and moves nothing;
- MoE: permuting tokens to experts and back reads and writes T k h e twice.
Units: elements for shapes, bytes for traffic.
"""

from dataclasses import dataclass

from cost_models.compute import Gemm
from planner.schemas import AttentionKernel, Layout, ModelSpec, PositionEmbedding, Recompute, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """Forward work of one layer, one micro-batch, one tensor-parallel rank."""

    dense_gemms: tuple[Gemm, ...]
    """Projections with weights (q/k/v, output, MLP or experts, router)."""
    attention_gemms: tuple[Gemm, ...]
    """Scores Q K^T and probabilities times V, batched over heads."""
    elementwise_bytes: float
    """Bytes moved by everything outside the attention core."""
    attention_elementwise_bytes: float
    """Bytes moved by softmax and attention dropout (eager attention only)."""
    flash_attention: bool
    """Whether the attention core is one fused FlashAttention kernel."""


def layer_work(model: ModelSpec, training: TrainingSpec, layout: Layout) -> LayerWork:
    """Forward GEMMs and elementwise traffic of one transformer layer (see module docstring)."""
    t, b, s = layout.tensor_parallel_degree, layout.micro_batch_size, training.seq_len
    h, e = model.hidden_size, training.dtype.bytes
    tokens = b * s
    seq_tokens = tokens // t if layout.sequence_parallel else tokens
    q_dim = model.num_attention_heads * model.head_size
    kv_dim = model.kv_heads * model.head_size
    heads = model.num_attention_heads // t
    f = model.ffn_size
    dropout_mask = 1 if model.hidden_dropout > 0 else 0

    dense = [Gemm(tokens, (q_dim + 2 * kv_dim) // t, h), Gemm(tokens, h, q_dim // t)]
    mlp_in = (2 if model.hidden_act.gated else 1) * f // t
    if model.is_moe:
        k, experts = model.num_experts_per_tok, model.num_local_experts
        ep = layout.expert_parallel_degree
        tokens_per_expert = max(1, tokens * ep * k // experts)
        local = experts // ep
        dense += [
            Gemm(tokens, experts, h),
            Gemm(tokens_per_expert, mlp_in, h, batch=local),
            Gemm(tokens_per_expert, h, f // t, batch=local),
        ]
        routed_tokens = tokens * k
    else:
        dense += [Gemm(tokens, mlp_in, h), Gemm(tokens, h, f // t)]
        routed_tokens = tokens

    attention = (
        Gemm(s, s, model.head_size, batch=b * heads),
        Gemm(s, model.head_size, s, batch=b * heads),
    )

    act_bytes = (3 if model.hidden_act.gated else 2) * routed_tokens * (f // t) * e
    norms = 2 * 2 * seq_tokens * h * e
    residuals = 2 * (3 * e + dropout_mask) * seq_tokens * h
    rotary = 2 * tokens * (q_dim + kv_dim) // t * e if model.position_embedding_type is PositionEmbedding.ROPE else 0
    permute = 2 * 2 * routed_tokens * h * e if model.is_moe else 0

    flash = training.attention_kernel is AttentionKernel.FLASH
    scores = b * heads * s * s
    attn_mask = 1 if model.attention_dropout > 0 else 0
    attention_bytes = 0.0 if flash else (2 * e + (2 * e + attn_mask if attn_mask else 0)) * scores
    return LayerWork(
        dense_gemms=tuple(dense),
        attention_gemms=attention,
        elementwise_bytes=float(act_bytes + norms + residuals + rotary + permute),
        attention_elementwise_bytes=float(attention_bytes),
        flash_attention=flash,
    )


def output_layer_gemm(model: ModelSpec, training: TrainingSpec, layout: Layout) -> Gemm:
    """Logits: (b s x h) @ (h x V/t), the vocabulary split over the tensor-parallel group."""
    tokens = layout.micro_batch_size * training.seq_len
    return Gemm(tokens, -(-model.vocab_size // layout.tensor_parallel_degree), model.hidden_size)


def output_layer_elementwise_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Cross-entropy over fp32 logits: write, read for softmax, write the gradient (3 x 4 bytes)."""
    tokens = layout.micro_batch_size * training.seq_len
    return 3.0 * 4 * tokens * model.vocab_size / layout.tensor_parallel_degree


def embedding_elementwise_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Embedding lookup (and position add, dropout): write, read, write b s h e."""
    tokens = layout.micro_batch_size * training.seq_len
    return 3.0 * tokens * model.hidden_size * training.dtype.bytes


def model_flops_per_sequence(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of forward + backward for one sequence, no recomputation.

    3 x forward FLOPs of every GEMM (dense and attention, attention over the full s x s as
    Narayanan et al. and Korthikanti et al. count it; MoE counts only the top-k experts).
    For a GPT block this is 72 s l h^2 (1 + s/(6h) + V/(12 h l)) per sequence (Korthikanti et
    al. 2022, appendix).
    """
    h, s = model.hidden_size, seq_len
    q_dim = model.num_attention_heads * model.head_size
    kv_dim = model.kv_heads * model.head_size
    f = model.ffn_size
    mlp = (3 if model.hidden_act.gated else 2) * h * f * model.num_experts_per_tok
    router = h * model.num_local_experts if model.is_moe else 0
    dense_per_token = 2 * (h * (q_dim + 2 * kv_dim) + q_dim * h + mlp + router)
    attention_per_seq = 2 * 2 * s * s * q_dim
    per_layer = dense_per_token * s + attention_per_seq
    logits = 2 * s * h * model.vocab_size
    return 3.0 * (model.num_hidden_layers * per_layer + logits)


PROFILED_TENSOR_PARALLEL = (1, 2, 4, 8)
"""Tensor-parallel degrees whose GEMM shapes ``planner profile --model`` times."""
PROFILED_MICRO_BATCHES = (1, 2)
"""Micro-batch sizes whose GEMM shapes ``planner profile --model`` times."""


def hardware_flop_ratio(model: ModelSpec, seq_len: int, recompute: Recompute) -> float:
    """Hardware FLOPs / model FLOPs of one training step.

    Full recompute adds one forward of every transformer layer (Narayanan et al. eq. 3: 96 vs
    72 B s l h^2); selective adds the attention core's forward; none adds nothing.

    Args:
        model: the model.
        seq_len: tokens per sequence.
        recompute: what the backward recomputes.

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
    attention_fwd = l * 2 * 2 * s * s * model.num_attention_heads * model.head_size
    return (per_seq + attention_fwd) / per_seq


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
            work = layer_work(model, training, layout)
            for g in (*work.dense_gemms, output_layer_gemm(model, training, layout)):
                for shape in (g, *g.backward()):
                    shapes.add((shape.m, shape.n, shape.k))
    return tuple(sorted(shapes))
