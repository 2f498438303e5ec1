"""ModelSpec: a dense or mixture-of-experts decoder transformer.

Field names are those of a Hugging Face ``config.json`` so that a real one is a valid
model file; ``planner.inputs.model_from_dict`` decides which of a file's keys are read.
"""

from typing import Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.enums import Activation, NormKind, PositionEmbedding
from planner.schemas.errors import SchemaError


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
        default=None, ge=1, description="MLP width f (per expert for MoE); defaults to 4h."
    )
    vocab_size: int = Field(ge=1, description="Vocabulary size V.")
    hidden_act: Activation = Field(default=Activation.GELU, description="'silu'/'swiglu' mean a gated (SwiGLU) MLP.")
    tie_word_embeddings: bool = Field(
        default=True, description="Output layer shares the input embedding (HF's default)."
    )
    max_position_embeddings: int = Field(default=2048, ge=1)
    position_embedding_type: PositionEmbedding = Field(default=PositionEmbedding.ROPE)
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

    @model_validator(mode="after")
    def _check_shapes(self) -> Self:
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
        return self

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
        """MLP width f, resolving the default 4h."""
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts."""
        return self.num_local_experts > 1
