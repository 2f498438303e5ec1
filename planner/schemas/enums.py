"""Closed choices, as string enums so that files and the CLI spell them the same way."""

from enum import IntEnum, StrEnum


class DType(StrEnum):
    """A precision tensors are stored, computed or sent in. A run trains in bf16, fp16 or fp32
    (``TRAINING_DTYPES``); fp8 and mxfp8 are what an FP8 recipe's linear GEMMs compute in and its
    FP8 all-gathers send (``TrainingSpec.fp8``), and the keys of a device's FP8 peaks."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"
    """E4M3/E5M2 with a scale per tensor, row or 128-block: Hopper's and Blackwell's FP8 tensor cores."""
    MXFP8 = "mxfp8"
    """E4M3 in 1x32 blocks with E8M0 scales: Blackwell's block-scaled (MX) tensor cores."""

    @property
    def bytes(self) -> int:
        """Bytes of one element (an MX block's one-byte scale per 32 elements aside)."""
        return _ELEMENT_BYTES[self]

    @property
    def trains(self) -> bool:
        """Whether a run can train in this precision (``--dtype``): fp8 and mxfp8 are recipes'
        GEMM precisions, given with ``--fp8``."""
        return self in TRAINING_DTYPES


_ELEMENT_BYTES = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4, DType.FP8: 1, DType.MXFP8: 1}
"""``DType.bytes`` (a table built once: a search reads it millions of times)."""

TRAINING_DTYPES = (DType.BF16, DType.FP16, DType.FP32)
"""The precisions a run trains in (``TrainingSpec.dtype``)."""


class Activation(StrEnum):
    """MLP activation, spelled as Hugging Face's ``hidden_act``."""

    GELU = "gelu"
    GELU_NEW = "gelu_new"
    GELU_TANH = "gelu_pytorch_tanh"
    RELU = "relu"
    SILU = "silu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"
    """GELU(gate) x up (Shazeer 2020): Gemma's MLP, whose hidden_act names the GELU alone."""

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (SwiGLU, GEGLU: three matrices) rather than two matrices."""
        return self in (Activation.SILU, Activation.SWIGLU, Activation.GEGLU)


class NormKind(StrEnum):
    """Normalization layer: LayerNorm has a weight and a bias, RMSNorm only a weight."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class PositionEmbedding(StrEnum):
    """Learned absolute position embeddings (GPT), rotary (no parameters), or ALiBi (Press et al.
    2022, MPT, BLOOM: a per-head linear bias on the attention scores, added inside the attention
    kernel; no parameters)."""

    ABSOLUTE = "absolute"
    ROPE = "rope"
    ALIBI = "alibi"


class AttentionKernel(StrEnum):
    """How attention is computed: a fused kernel that never stores the s x s scores, priced at
    that kernel's own rates (``cost_models.compute.fused_attention_s``), or eager (scores
    materialized)."""

    FLASH = "flash"
    """FlashAttention-2, as PyTorch's SDPA and flash-attn 2.x run it."""
    CUDNN = "cudnn"
    """cuDNN's fused attention (Transformer Engine's default on Hopper and later): the same
    memory as FlashAttention, its own rates."""
    EAGER = "eager"

    @property
    def fused(self) -> bool:
        """Whether the attention core is one fused kernel (no s x s scores kept)."""
        return self is not AttentionKernel.EAGER


class Kernels(StrEnum):
    """How the elementwise work around the GEMMs runs (``cost_models.kernels``): one kernel per
    tensor operation, each reading its inputs from memory and writing its output (eager PyTorch,
    the planner's own runtime), or fused kernels that make one pass (Transformer Engine,
    Megatron-Core, torch.compile)."""

    FUSED = "fused"
    EAGER = "eager"


class LossMethod(StrEnum):
    """What the cross-entropy over the logits keeps and allocates (``cost_models.loss_memory``), per
    logit element beyond the logits themselves; how fast it runs is ``Kernels`` (``loss_kernels``)."""

    FP32_IN_PLACE = "fp32-in-place"
    """One fp32 copy of the logits becomes the softmax, is kept, and becomes the gradient in place:
    Megatron-LM's ``vocab_parallel_cross_entropy`` and its fused variant, the planner's runtime
    (``runtime.loss``)."""
    FP32_EAGER = "fp32-eager"
    """torch's ``F.cross_entropy`` over ``logits.float()``, eager: it keeps the fp32 log-softmax,
    and its backward builds two more fp32 copies (nll_loss's gradient and log_softmax's)."""
    EAGER = "eager"
    """torch's ``F.cross_entropy`` over the logits in their own precision, eager: the same copies
    in that precision (its log-softmax kept, two gradients in the backward)."""
    FUSED = "fused"
    """One kernel each way (torch.compile of the same code, flash-attn's Triton cross-entropy): it
    keeps the logits and one fp32 statistic per token, and writes the gradient in the logits'
    precision."""


class PipelineBuffers(StrEnum):
    """Where a pipeline stage receives its activations and gradients (``cost_models.memory.pipeline_buffer_bytes``)."""

    PER_MICRO_BATCH = "per-micro-batch"
    """One buffer per micro-batch of the schedule for each chunk's input and each chunk's output
    gradient, allocated at the first step and kept, and each chunk's output kept until its
    backward: torch.distributed.pipelining (torch 2.13), which the planner's runtime and
    torchtitan run."""
    PER_TRANSFER = "per-transfer"
    """Each received tensor allocated for its transfer and freed once used, and each output's
    data freed once sent (Megatron-LM's p2p communication with ``deallocate_output_tensor``)."""


class MoeDispatcher(StrEnum):
    """How an MoE layer moves its routed tokens between expert-parallel ranks."""

    ALLTOALL = "alltoall"
    """One all-to-all of every (token, expert) pair (Megatron-LM's alltoall dispatcher, this
    planner's runtime)."""
    DEEPEP = "deepep"
    """Each token crosses to a remote node once, to the GPU of its own rail there, which forwards
    it over NVLink to that node's experts, and the combine reduces on the way back (DeepSeek-V3
    report sec. 3.2.2; DeepEP's normal kernels; Megatron-Core's flex dispatcher)."""


class Optimizer(StrEnum):
    """Optimizer; Adam keeps two moments per parameter."""

    ADAM = "adam"


class Recompute(StrEnum):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"
    """The modules ``Layout.recompute_modules`` names (by default the attention core alone)."""
    FULL = "full"


class RecomputeModule(StrEnum):
    """A part of a transformer layer that selective recomputation re-runs in the backward instead
    of keeping its activations: Megatron-Core's ``--recompute-modules`` (``TransformerConfig.recompute_modules``;
    ``transformer_layer.py``, ``moe/moe_layer.py``, ``moe/experts.py``), in its names.
    What each frees and re-runs is ``cost_models.activations.kept_bytes`` and ``cost_models.timing``'s."""

    CORE_ATTN = "core_attn"
    """The attention core (scores, softmax, dropout): Korthikanti et al.'s selective recompute,
    Megatron-Core's default module."""
    LAYERNORM = "layernorm"
    """The two norms: their outputs (the QKV and MLP/router inputs) are discarded after their
    consumers ran and rebuilt from the norms' inputs (output-discarding checkpoint)."""
    MOE_ACT = "moe_act"
    """The routed experts' activation function: its output (the down projection's input) is
    discarded and rebuilt from the up projections' outputs (output-discarding checkpoint)."""
    MLP = "mlp"
    """A dense layer's whole MLP (checkpointed: only its input is kept)."""
    MOE = "moe"
    """An MoE layer's whole MoE block, router, dispatch, experts and combine (checkpointed: only its
    input is kept; its recompute sends the dispatch and combine all-to-alls again)."""


class SelectiveRecompute(StrEnum):
    """What selective recomputation (``Recompute.SELECTIVE``) keeps of a layer and re-runs in its
    backward, as the stack runs it (``cost_models.activations.kept_bytes``, ``cost_models.layer_time``)."""

    MODULES = "modules"
    """The layout's ``recompute_modules`` (Megatron-Core's ``--recompute-modules``; by default the
    attention core)."""
    EVERY_OTHER_MATMUL = "every-other-matmul"
    """torchtitan's per-op policy (``selective_ac_option = 'op'``): it keeps the layer's input, the
    attention kernel's outputs, the outputs of the layer's 1st, 3rd, ... matmuls in forward order
    (of q, k, v, output, then the MLP's up (gate, up) and down projections: q, v, the MLP's first
    and its down projection's) and of its reduce-scatters, and re-runs every other op in the
    backward: the even matmuls, the norms, the rotary embedding, the activation, the residual
    adds, the all-gathers. Priced on dense layers with q, k and v projections apart (torchtitan's
    models); an MoE or multi-head latent attention layer is priced as ``MODULES``."""


class Schedule(StrEnum):
    """Pipeline schedule."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class ContextParallelKind(StrEnum):
    """How the ranks of a context-parallel group attend over the sequence they split."""

    RING = "ring"
    """Ring attention (Liu et al. 2023): every rank keeps its queries and passes its key/value
    block around the group, one hop per step, behind the attention of the block in hand
    (Megatron-Core's ``--cp-comm-type p2p``, torch's ``context_parallel``)."""
    ALL_TO_ALL = "all-to-all"
    """DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): an all-to-all turns each rank's
    share of the sequence for all heads into the whole sequence for 1/cp of the heads (q, k and v),
    attention runs locally, and another all-to-all turns the output back; in line with the compute
    (Megatron-Core's ``--cp-comm-type a2a``). Needs the query heads of a tensor-parallel rank
    divisible by cp."""


class VocabularyLayout(StrEnum):
    """Where the vocabulary layers (input embedding; final norm, output layer and loss) sit."""

    PINNED = "pinned"
    """The embedding with the first model chunk, the output layer and loss with the last (split
    over the tensor-parallel group, with a vocabulary-parallel loss, when t > 1)."""
    VOCAB_1 = "vocab-1"
    """Vocabulary Parallelism (Yeung et al., MLSys 2025), its Algorithm 1: the embedding, output
    layer and loss split by vocabulary over every pipeline rank; two all-reduce barriers per
    micro-batch, overlapped with the transformer layers, at two more micro-batches of
    activations in flight (p + 2 under 1F1B)."""
    VOCAB_2 = "vocab-2"
    """As ``VOCAB_1``, its Algorithm 2: one barrier, one more micro-batch in flight (p + 1)."""

    @property
    def over_pipeline(self) -> bool:
        """Whether every pipeline rank holds a vocabulary shard of the embedding and output layer."""
        return self is not VocabularyLayout.PINNED

    @property
    def extra_in_flight(self) -> int:
        """Micro-batches of activations held beyond the schedule's own, on every stage."""
        return {VocabularyLayout.PINNED: 0, VocabularyLayout.VOCAB_1: 2, VocabularyLayout.VOCAB_2: 1}[self]


class ZeroStage(IntEnum):
    """ZeRO stage (Rajbhandari et al. 2020): what data parallel ranks shard."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3

    @property
    def shards_optimizer_states(self) -> bool:
        """Stages 1-3 split the optimizer states over the data-parallel ranks (P_os)."""
        return self >= ZeroStage.OPTIMIZER

    @property
    def shards_gradients(self) -> bool:
        """Stages 2-3 also split the gradients (P_os+g)."""
        return self >= ZeroStage.GRADIENTS

    @property
    def shards_parameters(self) -> bool:
        """Stage 3 also splits the parameters, gathered module by module when used (P_os+g+p)."""
        return self >= ZeroStage.PARAMETERS


class CollectiveOp(StrEnum):
    """Collective operations the cost models price."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"

    def volume_factor(self, n: int) -> float:
        """Share of the full buffer each of ``n`` ranks sends (nccl-tests, "PERFORMANCE.md"):
        2(n-1)/n for all-reduce, (n-1)/n for the others; 0 for one rank."""
        if n <= 1:
            return 0.0
        return (2.0 if self is CollectiveOp.ALL_REDUCE else 1.0) * (n - 1) / n


class Placement(StrEnum):
    """Where a process group's members sit."""

    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"


class OnFault(StrEnum):
    """What ``planner run`` does when its straggler detector names a rank or a slow link."""

    WARN = "warn"
    """Log it, record it in the run report, train on."""
    EXIT = "exit"
    """As WARN, then every rank stops after that step and exits with ``StragglerFound``'s code."""
