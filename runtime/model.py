"""The reference decoder the runtime trains, built from a ModelSpec.

GELU or SwiGLU MLP, multi-head, grouped-query or multi-head latent attention
(``runtime.latent_attention``), LayerNorm or RMSNorm (SwiGLU and
RMSNorm as the fused kernels keep their tensors, ``runtime.kernels``), learned or
rotary positions, tied or untied output layer; deterministic initialisation from a seed. Layers
live in a ModuleDict keyed by their index, so a pipeline stage keeps the reference's parameter
names when the layers it does not hold are deleted. Projections are separate Linear modules so
tensor parallelism can split them by name. A mixture-of-experts model's MoE layers
(``ModelSpec.is_moe_layer``) hold an ``MoE`` and, with shared experts, a ``SharedExpert``
(``runtime.mlp``); its other layers a dense MLP. A chunk may hold only some of its experts,
which expert parallelism (``runtime.expert_parallel``) feeds.
"""

import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.graph import save_on_cpu
from torch.nn.attention import SDPBackend
from torch.utils.checkpoint import checkpoint

from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    AttentionKernel,
    DType,
    ModelSpec,
    NormKind,
    PositionEmbedding,
    Recompute,
    RecomputeModule,
)
from planner.schemas.runtime_support import unbuilt_features
from runtime.attention_parts import attention_core, positions_of, rotary
from runtime.context_share import ContextShare
from runtime.kernels import RMSNorm
from runtime.latent_attention import LatentAttention
from runtime.loss import cross_entropy
from runtime.mlp import MLP, MoE, SharedExpert, moe_layers

TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}

CUDA_ATTENTION_BACKENDS = {
    AttentionKernel.FLASH: SDPBackend.FLASH_ATTENTION,
    AttentionKernel.CUDNN: SDPBackend.CUDNN_ATTENTION,
    AttentionKernel.EAGER: SDPBackend.MATH,
}
"""The scaled-dot-product-attention backend that runs each attention kernel on a CUDA device:
FlashAttention-2, cuDNN's fused attention, or the math kernel that keeps the scores."""


def attention_backend(kernel: AttentionKernel, device: torch.device) -> SDPBackend | None:
    """The SDPA backend a plan's attention kernel runs on ``device``: on CUDA the one it was
    priced for (``CUDA_ATTENTION_BACKENDS``); elsewhere None, SDPA's own choice (a CPU runs
    neither GPU kernel, and its fused one keeps no scores either)."""
    return CUDA_ATTENTION_BACKENDS[kernel] if device.type == "cuda" else None


def attention_priority(kernel: AttentionKernel, device: torch.device) -> list[SDPBackend] | None:
    """The SDPA backends a run allows, in priority order (``sdpa_kernel(..., set_priority=True)``):
    on CUDA the kernel's own backend first (``attention_backend``), then for a fused kernel the
    others SDPA has, for the shapes and precisions it lacks (FlashAttention-2 runs no fp32, cuDNN's
    attention not every head size); eager only the math kernel, which runs everything. None
    elsewhere."""
    first = attention_backend(kernel, device)
    if first is None:
        return None
    if not kernel.fused:
        return [first]
    fused = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    return [first, *(b for b in fused if b is not first)]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built inside get parameters of ``dtype``."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _norm(model: ModelSpec) -> nn.Module:
    if model.norm_type is NormKind.LAYERNORM:
        return nn.LayerNorm(model.hidden_size)
    return RMSNorm(model.hidden_size, eps=1e-5)


class Attention(nn.Module):
    """Causal self-attention; head counts follow the (possibly tensor-parallel) projection widths.
    Biases on q, k, v as ``qkv_bias`` says (Qwen2), on o as ``attention_bias``; Qwen3's q/k norms.

    ``recompute_core`` drops the attention core's activations and recomputes them in the backward
    (selective recompute, Korthikanti et al. 2022).
    """

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.recompute_core = False
        h, hd = model.hidden_size, model.head_size
        self.head_dim = hd
        self.rope = model.position_embedding_type is PositionEmbedding.ROPE
        self.rope_theta = model.rope_theta
        qkv_bias = model.attention_bias if model.qkv_bias is None else model.qkv_bias
        self.q = nn.Linear(h, model.num_attention_heads * hd, bias=qkv_bias)
        self.k = nn.Linear(h, model.kv_heads * hd, bias=qkv_bias)
        self.v = nn.Linear(h, model.kv_heads * hd, bias=qkv_bias)
        self.o = nn.Linear(model.num_attention_heads * hd, h, bias=model.attention_bias)
        # Qwen3's RMSNorm over each q and k head (one weight of hd, shared by the heads)
        self.q_norm = RMSNorm(hd, eps=1e-6) if model.qk_norm else None
        self.k_norm = RMSNorm(hd, eps=1e-6) if model.qk_norm else None
        self.context: ContextShare | None = None
        """Set under context parallelism: this rank holds a share of each sequence, and attention
        exchanges keys and values over its context-parallel group (``runtime.context_share``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim) for p in (self.q, self.k, self.v))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope:
            positions = positions_of(s, x.device, self.context)
            q, k = rotary(q, positions, self.rope_theta), rotary(k, positions, self.rope_theta)
        out = attention_core(q, k, v, context=self.context, recompute=self.recompute_core)
        result: torch.Tensor = self.o(out.transpose(1, 2).reshape(b, s, -1))
        return result


def builds_layers(model: ModelSpec) -> bool:
    """Whether this decoder builds ``model``'s layers as specified (``schemas.runtime_support``
    names what it does not build: ALiBi, a gated shared expert with MLP biases)."""
    return not unbuilt_features(model)


class Block(nn.Module):
    """Pre-norm transformer layer; ``recompute_all`` keeps only its input for the backward (full
    recompute); ``recompute_mlp`` keeps only its MLP's (MoE block's) input and re-runs the block in
    the backward, an MoE block's dispatch, combine and shared experts included (selective
    recompute of Megatron-Core's ``mlp`` or ``moe`` module). Its attention is DeepSeek's
    multi-head latent attention (``runtime.latent_attention``) for an MLA model. ``experts``: an MoE layer's experts
    held here (None: a dense MLP, f wide); an MoE layer of a model with shared experts has its
    ``shared_expert`` beside them (every rank holds it, whatever the expert placement).
    ``offload_activations`` keeps what the layer saves for its backward in pinned host memory
    (torch's ``save_on_cpu``: copied down in the forward, up at first use in the backward;
    ``Layout.activation_offload_layers``)."""

    def __init__(self, model: ModelSpec, experts: Sequence[int] | None = None) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(model), _norm(model)
        self.attn: Attention | LatentAttention = LatentAttention(model) if model.is_mla else Attention(model)
        self.mlp: MLP | MoE = MLP(model) if experts is None else MoE(model, experts)
        shared = experts is not None and model.shared_ffn_size > 0
        self.shared_expert: SharedExpert | None = SharedExpert(model) if shared else None
        self.recompute_all = False
        self.recompute_mlp = False
        self.offload_activations = False

    def _feed_forward(self, normed: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(normed)
        if self.shared_expert is not None:
            out = out + self.shared_expert(normed)
        return out

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        normed = self.norm2(x)
        ff = self._feed_forward
        mlp = checkpoint(ff, normed, use_reentrant=False) if self.recompute_mlp else ff(normed)
        out: torch.Tensor = x + mlp
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_all:
            out: torch.Tensor = checkpoint(self._forward, x, use_reentrant=False)
            return out
        if self.offload_activations:
            with save_on_cpu(pin_memory=True):
                return self._forward(x)
        return self._forward(x)


class Decoder(nn.Module):
    """Token (+ position) embedding, layers, final norm and output layer; any part may be absent on
    a pipeline stage, in which case the stage takes or returns hidden states."""

    def __init__(
        self,
        model: ModelSpec,
        *,
        seed: int,
        layers: range | None = None,
        embedding: bool = True,
        output: bool = True,
        vocabulary: bool = True,
        experts: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """The whole model, or a pipeline chunk of it: ``layers`` (default all), with or without the
        embedding and the output layer; an MoE layer i holds experts ``experts[i]`` (default all).
        ``vocabulary`` False leaves out the token embedding's and the output layer's matrices (split
        over the pipeline by ``runtime.vocabulary_parallel``): the chunk holding the embedding
        embeds tokens with ``embed_tokens``, the one holding the output layer returns the
        final-normed hidden states. Every parameter is initialised from its own generator, seeded
        by ``seed`` and its name (``initial_value``), so a chunk holds exactly the reference's values."""
        super().__init__()
        h = model.hidden_size
        self.takes_tokens = embedding
        self.embed_tokens: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Set when ``vocabulary`` is False on the embedding's chunk: token ids (b, s) to (b, s, h)."""
        self.tok_emb: nn.Embedding | None = (
            nn.Embedding(model.vocab_size, h)
            if vocabulary and (embedding or (output and model.tie_word_embeddings))
            else None
        )
        absolute = model.position_embedding_type is PositionEmbedding.ABSOLUTE
        self.pos_emb: nn.Embedding | None = (
            nn.Embedding(model.max_position_embeddings, h) if embedding and absolute else None
        )
        kept = range(model.num_hidden_layers) if layers is None else layers
        held = {i: (experts or {}).get(i, range(model.num_local_experts)) for i in moe_layers(model)}
        self.layers = nn.ModuleDict({str(i): Block(model, held.get(i)) for i in kept})
        self.norm: nn.Module | None = _norm(model) if output else None
        self.head: nn.Linear | None = nn.Linear(h, model.vocab_size, bias=False) if output and vocabulary else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.copy_(initial_value(seed, name, p.shape))
                elif name.endswith("bias"):
                    p.zero_()
        self.tied = model.tie_word_embeddings
        if self.tied and self.head is not None and self.tok_emb is not None:
            if embedding:
                self.head.weight = self.tok_emb.weight
            else:
                # A last pipeline stage's own copy of the tied matrix: the embedding's values.
                self.head.weight = nn.Parameter(self.tok_emb.weight.detach().clone())
                self.tok_emb = None
        self.context: ContextShare | None = None
        """Set under context parallelism (``runtime.context_share.ContextShare.hold``): the
        chunk takes this rank's share of each sequence."""
        self.to_sequence_shards: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Set under sequence parallelism: splits the embedded sequence over the tensor-parallel ranks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s) to logits (b, s, V); a stage without the embedding takes hidden states,
        one without the output layer returns them."""
        if self.takes_tokens:
            embed = self.tok_emb if self.tok_emb is not None else self.embed_tokens
            assert embed is not None, "a chunk without its token embedding needs embed_tokens"
            h = embed(x)
            if self.pos_emb is not None:
                h = h + self.pos_emb(positions_of(x.shape[1], x.device, self.context))
            if self.to_sequence_shards is not None:
                h = self.to_sequence_shards(h)
        else:
            h = x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            h = self.head(h)
        result: torch.Tensor = h
        return result


def initial_value(seed: int, name: str, shape: Sequence[int]) -> torch.Tensor:
    """A matrix parameter's initial value: N(0, 0.02^2) drawn in the default dtype from a
    generator seeded by ``seed`` and the parameter's name in the whole model (``head.weight``)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.randn(tuple(shape), generator=gen) * 0.02


def set_recompute(
    net: "Decoder",
    recompute: Recompute,
    modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES,
    *,
    full_layers: int | None = None,
) -> None:
    """Full: every layer keeps only its input, or the first ``full_layers`` of ``net``'s
    (``Layout.recompute_layers``: Megatron-LM's block method) while the others keep everything;
    selective: the attention core (core_attn) and a dense layer's MLP (mlp) or an MoE layer's
    block (moe) among ``modules`` are recomputed, each checkpointed whole (the output-discarding
    modules, layernorm and moe_act, are not built here: ``schemas.runtime_support`` refuses them)."""
    selective = set(modules) if recompute is Recompute.SELECTIVE else set()
    for i, block in enumerate(net.layers.values()):
        assert isinstance(block, Block)
        block.recompute_all = recompute is Recompute.FULL and (full_layers is None or i < full_layers)
        block.attn.recompute_core = RecomputeModule.CORE_ATTN in selective
        kind = RecomputeModule.MOE if isinstance(block.mlp, MoE) else RecomputeModule.MLP
        block.recompute_mlp = kind in selective


def set_activation_offload(net: "Decoder", layers: int) -> None:
    """Keep what the first ``layers`` of ``net``'s layers save for their backward in host memory
    (``Layout.activation_offload_layers``; the layout has one stage, whose chunk starts at the
    model's first layer)."""
    for i, block in enumerate(net.layers.values()):
        assert isinstance(block, Block)
        block.offload_activations = i < layers


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token, keeping one fp32 copy of the logits (``runtime.loss``)."""
    return cross_entropy(logits, targets)
