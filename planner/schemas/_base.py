"""The pydantic base shared by every on-disk schema."""

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Immutable, strict: unknown keys are an error, values are validated on construction."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)
