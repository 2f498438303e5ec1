"""ModelSpec: a dense or mixture-of-experts decoder transformer.

Field names are those of a Hugging Face ``config.json`` so that a real one is a valid
model file; ``planner.files.models.model_from_dict`` decides which of a file's keys are read.
The MoE and multi-head latent attention (MLA) fields follow transformers' Mixtral, Qwen2-MoE,
Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3 models (``modeling_*.py``): every one defaults to what
a dense Llama/GPT-style model means, so a dense config reads as before.
"""

import functools
import math
from typing import Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.bounds import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MAX_WIDTH,
    check_at_most,
)
from planner.schemas.enums import Activation, NormKind, PositionEmbedding
from planner.schemas.errors import SchemaError
from planner.schemas.rope import RopeScaling, RopeType

WIDTHS = (
    "hidden_size",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
)
"""ModelSpec's widths, each bounded by MAX_WIDTH."""


class ModelSpec(FrozenModel):
    """Shape of a decoder-only transformer; all sizes in elements, not bytes."""

    name: str = Field(default="custom", description="Preset name or file stem, for display.")
    hidden_size: int = Field(ge=1, description="Model width h.")
    num_hidden_layers: int = Field(ge=1, description="Transformer layers l.")
    num_attention_heads: int = Field(ge=1, description="Query heads a.")
    num_key_value_heads: int | None = Field(
        default=None, ge=1, description="Key/value heads (GQA); defaults to num_attention_heads."
    )
    head_dim: int | None = Field(default=None, ge=1, description="Defaults to hidden_size / heads.")
    intermediate_size: int | None = Field(
        default=None,
        ge=1,
        description="MLP width f of dense layers, and of each expert unless moe_intermediate_size is set; "
        "defaults to 4h.",
    )
    vocab_size: int = Field(ge=1, description="Vocabulary size V.")
    hidden_act: Activation = Field(
        default=Activation.GELU, description="'silu'/'swiglu'/'geglu' mean a gated MLP (gate, up, down)."
    )
    tie_word_embeddings: bool = Field(
        default=True, description="Output layer shares the input embedding (HF's default)."
    )
    max_position_embeddings: int = Field(
        default=2048,
        ge=1,
        description="Positions the model was built for (Hugging Face's default 2048); with rope_scaling, "
        "see max_seq_len.",
    )
    position_embedding_type: PositionEmbedding = Field(default=PositionEmbedding.ROPE)
    rope_theta: float = Field(default=10000.0, gt=0, description="Base of the rotary angles (rotary positions).")
    rope_scaling: RopeScaling | None = Field(
        default=None, description="How rotary positions are stretched past max_position_embeddings (HF's dict)."
    )
    norm_type: NormKind = Field(default=NormKind.RMSNORM)
    attention_bias: bool = Field(default=False, description="Biases on q, k, v and output projections.")
    mlp_bias: bool = Field(default=False, description="Biases on the MLP projections.")
    attention_dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on attention probabilities.")
    hidden_dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Dropout after attention and MLP (HF: resid_pdrop, hidden_dropout).",
    )
    num_local_experts: int = Field(default=1, ge=1, description="Experts per MoE layer; 1 is dense.")
    num_experts_per_tok: int = Field(default=1, ge=1, description="Experts each token is routed to (top-k).")
    moe_intermediate_size: int | None = Field(
        default=None, ge=1, description="Width of each routed expert (Qwen-MoE, DeepSeek); defaults to f."
    )
    n_shared_experts: int | None = Field(
        default=None,
        ge=0,
        description="DeepSeek: shared experts every token passes through, one MLP n x moe_intermediate_size wide.",
    )
    shared_expert_intermediate_size: int | None = Field(
        default=None,
        ge=0,
        description="Qwen2-MoE: width of the shared expert, whose output a sigmoid gate (h x 1) scales.",
    )
    first_k_dense_replace: int = Field(default=0, ge=0, description="DeepSeek: the first k layers have a dense MLP.")
    mlp_only_layers: tuple[int, ...] = Field(default=(), description="Qwen-MoE: indices of layers with a dense MLP.")
    decoder_sparse_step: int = Field(
        default=1, ge=1, description="Qwen-MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0."
    )
    n_group: int | None = Field(
        default=None, ge=1, description="DeepSeek: expert groups a token's routing is confined to (no parameters)."
    )
    topk_group: int | None = Field(default=None, ge=1, description="DeepSeek: groups each token may use.")
    q_lora_rank: int | None = Field(
        default=None, ge=1, description="MLA: rank of the query's down-projection; null projects q directly."
    )
    kv_lora_rank: int | None = Field(
        default=None, ge=1, description="MLA: rank of the compressed key/value; null means standard attention."
    )
    qk_rope_head_dim: int | None = Field(default=None, ge=1, description="MLA: rotary part of a q/k head.")
    qk_nope_head_dim: int | None = Field(default=None, ge=0, description="MLA: non-rotary part of a q/k head.")
    v_head_dim: int | None = Field(default=None, ge=1, description="MLA: value head width.")
    qkv_bias: bool | None = Field(
        default=None, description="Biases on q, k, v only (Qwen2); defaults to attention_bias."
    )
    qk_norm: bool = Field(
        default=False, description="RMSNorm over each q and k head (Qwen3); read from model_type, no HF key."
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> Self:
        layers = {"num_hidden_layers": self.num_hidden_layers, "first_k_dense_replace": self.first_k_dense_replace}
        check_at_most("", layers, MAX_LAYERS, "any model")
        experts = {name: getattr(self, name) for name in ("num_local_experts", "n_shared_experts", "n_group")}
        check_at_most("", experts, MAX_EXPERTS, "any model")
        check_at_most("", {name: getattr(self, name) for name in WIDTHS}, MAX_WIDTH, "any model")
        heads = {name: getattr(self, name) for name in ("num_attention_heads", "num_key_value_heads", "topk_group")}
        check_at_most("", heads, MAX_HEADS, "any model")
        check_at_most("", {"vocab_size": self.vocab_size}, MAX_VOCAB, "any model")
        positions = {"max_position_embeddings": self.max_position_embeddings}
        check_at_most("", positions, MAX_SEQ_LEN, "any model")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise SchemaError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}; set head_dim explicitly or fix one of them"
            )
        if self.num_attention_heads % self.kv_heads:
            raise SchemaError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.kv_heads}"
            )
        if self.num_experts_per_tok > self.num_local_experts:
            raise SchemaError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_local_experts={self.num_local_experts}"
            )
        if self.kv_lora_rank is not None and (self.qk_rope_head_dim is None or self.v_head_dim is None):
            raise SchemaError(
                f"kv_lora_rank={self.kv_lora_rank} (multi-head latent attention) needs qk_rope_head_dim and "
                "v_head_dim; set both, or drop kv_lora_rank for standard attention"
            )
        if self.n_group is not None and self.num_local_experts % self.n_group:
            raise SchemaError(
                f"n_group={self.n_group} does not divide num_local_experts={self.num_local_experts}; "
                "use a group count that divides the experts"
            )
        if self.topk_group is not None and self.topk_group > (self.n_group or 1):
            raise SchemaError(f"topk_group={self.topk_group} exceeds n_group={self.n_group}; lower topk_group")
        if self.rope_scaling is not None and self.position_embedding_type is not PositionEmbedding.ROPE:
            raise SchemaError(
                f"rope_scaling ({self.rope_scaling.rope_type}) stretches rotary positions, but the model's are "
                f"{self.position_embedding_type}; drop rope_scaling or set position_embedding_type: rope"
            )
        if self.is_moe and not any(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            raise SchemaError(
                f"model has {self.num_local_experts} experts but no MoE layer (first_k_dense_replace="
                f"{self.first_k_dense_replace}, mlp_only_layers, decoder_sparse_step={self.decoder_sparse_step}); "
                "fix the layer keys or set num_local_experts: 1"
            )
        return self

    @property
    def max_seq_len(self) -> int | None:
        """The longest sequence the model allows, in tokens; None where nothing limits it.

        Learned absolute positions (GPT-2, GPT-3): ``max_position_embeddings``, the rows of the
        position table. Rotary positions: ``max_position_embeddings``, or with ``rope_scaling``
        the length its type reaches (``RopeScaling.max_seq_len``: linear and dynamic multiply
        ``max_position_embeddings`` by the factor, yarn the original length; llama3 and longrope
        configs state the scaled length). ALiBi has no positions to run out of (Press et al.
        2022 train short and test long): None.
        """
        if self.position_embedding_type is PositionEmbedding.ALIBI:
            return None
        if self.rope_scaling is None:
            return self.max_position_embeddings
        return self.rope_scaling.max_seq_len(self.max_position_embeddings)

    @property
    def kv_heads(self) -> int:
        """Key/value heads, resolving the default."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        """Per-head width, resolving the default."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """MLP width f of a dense layer, resolving the default 4h."""
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        """Width of one routed expert: moe_intermediate_size, else f (Mixtral)."""
        return self.moe_intermediate_size or self.ffn_size

    @property
    def shared_ffn_size(self) -> int:
        """Width of the shared-expert MLP every token of an MoE layer passes through; 0 if none.

        DeepSeek: n_shared_experts experts of moe_intermediate_size, built as one MLP
        (transformers' ``DeepseekV3MoE.shared_experts``); Qwen2-MoE: shared_expert_intermediate_size.
        """
        deepseek = (self.n_shared_experts or 0) * self.expert_ffn_size
        return deepseek + (self.shared_expert_intermediate_size or 0)

    @property
    def has_shared_expert_gate(self) -> bool:
        """Qwen2-MoE scales its shared expert by sigmoid(h x 1 gate); DeepSeek's has no gate."""
        return bool(self.shared_expert_intermediate_size)

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts (in at least one layer)."""
        return self.num_local_experts > 1

    def is_moe_layer(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has a mixture-of-experts MLP.

        The single rule params, memory and time all use: DeepSeek's first_k_dense_replace and
        Qwen-MoE's mlp_only_layers / decoder_sparse_step, as transformers builds the layers.
        """
        return (
            self.is_moe
            and layer >= self.first_k_dense_replace
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def moe_layers_in(self, layers: range) -> int:
        """How many of ``layers`` are MoE layers."""
        if layers.step == 1 and layers.start >= 0 and layers.stop <= self.num_hidden_layers:
            before = _moe_layers_before(self)
            return before[layers.stop] - before[layers.start] if layers.start < layers.stop else 0
        return sum(1 for i in layers if self.is_moe_layer(i))

    @property
    def num_moe_layers(self) -> int:
        """MoE layers in the whole model; the other num_hidden_layers - this are dense."""
        return self.moe_layers_in(range(self.num_hidden_layers))

    @property
    def mlp_widths(self) -> tuple[int, ...]:
        """Every MLP width the model's layers use (tensor parallelism must divide each)."""
        moe_layers = self.num_moe_layers
        widths = {self.expert_ffn_size} if moe_layers else set()
        if moe_layers < self.num_hidden_layers:
            widths.add(self.ffn_size)
        if moe_layers and self.shared_ffn_size:
            widths.add(self.shared_ffn_size)
        return tuple(sorted(widths))

    @property
    def is_mla(self) -> bool:
        """Whether attention is DeepSeek's multi-head latent attention."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_size(self) -> int:
        """Width of one query/key head in the score product: nope + rope under MLA, else head_size."""
        if self.is_mla:
            return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
        return self.head_size

    @property
    def v_head_size(self) -> int:
        """Width of one value head: v_head_dim under MLA, else head_size."""
        return (self.v_head_dim or self.head_size) if self.is_mla else self.head_size


@functools.lru_cache(maxsize=64)
def _moe_layers_before(model: ModelSpec) -> tuple[int, ...]:
    """MoE layers among layers 0 .. i - 1, for i = 0 .. num_hidden_layers (``is_moe_layer``).

    Memoized per model (it is immutable and hashable): a search counts the MoE layers of every
    stage of tens of thousands of layouts, and ``moe_layers_in`` is then two lookups.
    """
    before = [0]
    for i in range(model.num_hidden_layers):
        before.append(before[-1] + model.is_moe_layer(i))
    return tuple(before)


def check_seq_len(model: ModelSpec, seq_len: int) -> None:
    """Refuse a sequence longer than ``model`` allows (``ModelSpec.max_seq_len``).

    Args:
        model: the model.
        seq_len: tokens per sequence of the training.

    Raises:
        SchemaError: one line naming seq_len, the model's limit and where it comes from, and the fix:
            a shorter sequence, or (rotary positions) a model file whose rope_scaling reaches further.
    """
    limit = model.max_seq_len
    if limit is None or seq_len <= limit:
        return
    mpe = model.max_position_embeddings
    unset = "" if "max_position_embeddings" in model.model_fields_set else " (not set: Hugging Face's default)"
    shorter = f"use a --seq-len of at most {limit}"
    if model.position_embedding_type is PositionEmbedding.ABSOLUTE:
        raise SchemaError(
            f"seq_len={seq_len} is longer than model {model.name!r} allows: {limit} tokens (learned absolute "
            f"positions, max_position_embeddings={mpe}{unset}: one table row per position); {shorter}, or a model "
            "with a larger max_position_embeddings (a larger table, trained to that length)"
        )
    scaling = model.rope_scaling
    if scaling is None or scaling.known_type is RopeType.DEFAULT:
        why = f"rotary positions, max_position_embeddings={mpe}{unset}, no rope_scaling"
        original = mpe
    else:
        why = f"rotary positions, {scaling.describe(mpe)}"
        original = scaling.original_max_position_embeddings or mpe
    example = (
        f"rope_scaling: {{rope_type: yarn, factor: {math.ceil(seq_len / original)}, "
        f"original_max_position_embeddings: {original}}}"
    )
    raise SchemaError(
        f"seq_len={seq_len} is longer than model {model.name!r} allows: {limit} tokens ({why}); {shorter}, or "
        f"extend the context in a model file (a copy of the model's keys): {example} reaches {seq_len} tokens or "
        "more (or raise max_position_embeddings if the model was trained that long)"
    )
