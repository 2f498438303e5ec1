"""The pydantic base shared by every on-disk schema."""

from pydantic import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    """Immutable, strict: unknown keys are an error, values are validated on construction.

    Its hash is computed once per object and kept in a slot of its own (pydantic hashes every
    field at each call, and the cost model's memo tables hash the model and the cluster hundreds
    of thousands of times in a search). The slot is not a field: equality, copies (which compute
    their own) and serialization do not see it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)
    __slots__ = ("_memo_hash",)

    def __hash__(self) -> int:
        memo: int | None = getattr(self, "_memo_hash", None)
        if memo is None:
            memo = hash((type(self), *self.__dict__.values()))
            object.__setattr__(self, "_memo_hash", memo)
        return memo
