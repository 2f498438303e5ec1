"""The pydantic base shared by every on-disk schema."""

from typing import Self

from pydantic import BaseModel, ConfigDict, model_validator

from planner.schemas.bounds import check_counts


class FrozenModel(BaseModel):
    """Immutable, strict: unknown keys are an error, values are validated on construction; no
    number is NaN or infinite, and no whole number is beyond ``bounds.MAX_COUNT``.

    Its hash is computed once per object and kept in a slot of its own (pydantic hashes every
    field at each call, and the cost model's memo tables hash the model and the cluster hundreds
    of thousands of times in a search); a mapping field hashes as its sorted items. The slot is not
    a field: equality, copies (which compute their own) and serialization do not see it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False, allow_inf_nan=False)
    __slots__ = ("_memo_hash",)

    @model_validator(mode="after")
    def _check_counts(self) -> Self:
        check_counts("", self.__dict__)
        return self

    def __hash__(self) -> int:
        memo: int | None = getattr(self, "_memo_hash", None)
        if memo is None:
            # a mapping field (peak FLOP/s or GEMM share by precision) hashes as its sorted items
            values = (tuple(sorted(v.items())) if isinstance(v, dict) else v for v in self.__dict__.values())
            memo = hash((type(self), *values))
            object.__setattr__(self, "_memo_hash", memo)
        return memo
