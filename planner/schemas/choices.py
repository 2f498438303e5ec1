"""The values a search axis takes: what the matching Layout fields hold, and what a search
constraint (``SearchSettings.constraints``) may name."""

from dataclasses import dataclass

from planner.schemas.enums import (
    ContextParallelKind,
    Recompute,
    RecomputeModule,
    Schedule,
    VocabularyLayout,
    ZeroStage,
)
from planner.schemas.layout import DEFAULT_RECOMPUTE_MODULES


@dataclass(frozen=True, slots=True)
class RecomputeChoice:
    """A value of the recompute axis: the Layout's ``recompute`` and ``recompute_modules``."""

    recompute: Recompute
    modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES
    """What selective recomputation re-runs, in ``RecomputeModule``'s order; the default otherwise."""

    def __str__(self) -> str:
        if self.modules == DEFAULT_RECOMPUTE_MODULES:
            return str(self.recompute)
        return f"{self.recompute}:" + "+".join(self.modules)


Choice = int | bool | Schedule | Recompute | RecomputeChoice | ZeroStage | VocabularyLayout | ContextParallelKind | None
"""A value one axis takes: what the matching Layout field holds (the recompute axis: two fields;
a constraint on it may name a mode, ``Axis.choices``)."""
