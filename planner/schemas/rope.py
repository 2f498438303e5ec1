"""Rotary position scaling: how far a model's rotary positions reach.

``RopeScaling`` is a Hugging Face ``config.json``'s ``rope_scaling`` (transformers 5 spells it
``rope_parameters``), its keys under their names. The planner reads it for one thing: the longest
sequence the model allows (``max_seq_len``). Which length a config's ``max_position_embeddings``
states depends on the rope type, as transformers builds each (``modeling_rope_utils.py``) and
vLLM reads it (``_get_and_verify_max_len``):

- ``linear`` (position interpolation: every position divided by ``factor``) and ``dynamic``
  (dynamic NTK: the base grows once a sequence passes ``max_position_embeddings``): the config's
  ``max_position_embeddings`` is the length the model was trained at, the limit that times
  ``factor``. Gemma 3 alone states the scaled length there (its 128K), marked by
  ``scaled_max_position_embeddings``.
- ``yarn``: the limit is "pre-yarn length x factor", the pre-yarn length being
  ``original_max_position_embeddings``, else ``max_position_embeddings`` (transformers' own
  wording; DeepSeek-V3: 4096 x 40 = 163840, its ``max_position_embeddings``; Qwen3's model cards
  add a factor-4 YaRN from 32768 to reach 131072 and leave ``max_position_embeddings`` 40960).
- ``llama3`` and ``longrope``: ``max_position_embeddings`` is already the extended length (Llama
  3.1: 131072, though its factor 8 times its original 8192 is 65536; Phi-3: 131072 beside a
  top-level ``original_max_position_embeddings`` of 4096).
- ``default``, and any type the planner does not know (``mrope``, ...): the limit is
  ``max_position_embeddings``; the type is kept and named.
"""

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.errors import SchemaError


class RopeType(StrEnum):
    """Rope types whose reach the planner knows (transformers' ``ROPE_INIT_FUNCTIONS``)."""

    DEFAULT = "default"
    LINEAR = "linear"
    DYNAMIC = "dynamic"
    YARN = "yarn"
    LLAMA3 = "llama3"
    LONGROPE = "longrope"


# Types whose max_position_embeddings is the trained length, which scaling multiplies.
_MULTIPLIES_MAX_POSITIONS = frozenset({RopeType.LINEAR, RopeType.DYNAMIC})
# Types that need a factor (transformers' _validate_*_parameters require it).
_NEEDS_FACTOR = frozenset({RopeType.LINEAR, RopeType.DYNAMIC, RopeType.YARN, RopeType.LLAMA3})


class RopeScaling(FrozenModel):
    """A config's ``rope_scaling``: its type and the parameters that are single numbers.

    List-valued parameters (LongRoPE's ``short_factor``/``long_factor``, Qwen2-VL's
    ``mrope_section``) change no length and are not kept.
    """

    rope_type: str = Field(
        description="Hugging Face's rope_type (older configs: type); one the planner does not know is kept, "
        "and its limit taken as max_position_embeddings."
    )
    factor: float | None = Field(default=None, ge=1, description="How many times the context is stretched.")
    original_max_position_embeddings: int | None = Field(
        default=None, ge=1, description="The length the model was trained at before scaling (yarn, llama3)."
    )
    low_freq_factor: float | None = Field(default=None, description="llama3: low-frequency wavelength divisor.")
    high_freq_factor: float | None = Field(default=None, description="llama3: high-frequency wavelength divisor.")
    beta_fast: float | None = Field(default=None, description="yarn: rotations where extrapolation starts.")
    beta_slow: float | None = Field(default=None, description="yarn: rotations where interpolation ends.")
    mscale: float | None = Field(default=None, description="yarn (DeepSeek): attention scale coefficient.")
    mscale_all_dim: float | None = Field(default=None, description="yarn (DeepSeek): its denominator's coefficient.")
    attention_factor: float | None = Field(default=None, description="yarn, longrope: attention scale, if fixed.")
    scaled_max_position_embeddings: bool = Field(
        default=False,
        description="linear/dynamic: max_position_embeddings already is the scaled length (Gemma 3, read from "
        "model_type; no Hugging Face key).",
    )

    @model_validator(mode="after")
    def _factor_given(self) -> Self:
        if self.factor is None and self.known_type in _NEEDS_FACTOR:
            raise SchemaError(
                f"rope_scaling of rope_type {self.rope_type!r} needs a factor (how many times the context is "
                "stretched, e.g. factor: 4.0)"
            )
        return self

    @property
    def known_type(self) -> RopeType | None:
        """The rope type, if the planner knows it."""
        try:
            return RopeType(self.rope_type)
        except ValueError:
            return None

    def max_seq_len(self, max_position_embeddings: int) -> int:
        """The longest sequence, in tokens, of a model with this scaling (the module's rules).

        Args:
            max_position_embeddings: the config's ``max_position_embeddings``.
        """
        kind, factor = self.known_type, self.factor or 1.0
        if kind in _MULTIPLIES_MAX_POSITIONS and not self.scaled_max_position_embeddings:
            return int(max_position_embeddings * factor)
        if kind is RopeType.YARN:
            return int((self.original_max_position_embeddings or max_position_embeddings) * factor)
        return max_position_embeddings

    def describe(self, max_position_embeddings: int) -> str:
        """How ``max_seq_len`` follows from the config, e.g. ``rope_scaling yarn: 4096 x factor 40``."""
        kind, factor = self.known_type, f"{self.factor:g}" if self.factor else "1"
        what = f"rope_scaling {self.rope_type}"
        if kind is None:
            return f"{what} (a rope type the planner does not know: max_position_embeddings={max_position_embeddings})"
        if kind in _MULTIPLIES_MAX_POSITIONS and not self.scaled_max_position_embeddings:
            return f"{what}: max_position_embeddings {max_position_embeddings} x factor {factor}"
        if kind is RopeType.YARN:
            original = self.original_max_position_embeddings
            base = (
                f"original_max_position_embeddings {original}"
                if original
                else f"max_position_embeddings {max_position_embeddings}"
            )
            return f"{what}: {base} x factor {factor}"
        if kind is RopeType.DEFAULT:
            return f"{what} (no scaling): max_position_embeddings={max_position_embeddings}"
        return f"{what}: max_position_embeddings={max_position_embeddings}, already the scaled length"
