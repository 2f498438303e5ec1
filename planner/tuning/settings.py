"""What `planner tune` runs, how, and where it keeps it."""

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from planner.schemas import Plan, VocabularyLayout


class Selection(StrEnum):
    """Which of the search's plans the tuner runs."""

    TOP = "top"
    """The k fastest predicted: find the measured best among the model's favourites."""
    SPREAD = "spread"
    """k plans evenly spaced over the SPREAD_POOL x k fastest, the fastest included: a wider range
    of plans to calibrate on and to judge the model's ranking by."""


SPREAD_POOL = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneSettings:
    """How the tuner runs its trials and where it keeps them."""

    top_k: int = 10
    select: Selection = Selection.TOP
    steps: int = 10
    storage: str = "sqlite:///tune.db"
    study_name: str | None = None
    """None: one study per model, training and measured cluster."""
    launcher: str | None = None
    """A shell template (planner.tuning.launcher); None runs locally with torchrun."""
    trial_timeout_s: float = 600.0
    workdir: Path = Path("tune")
    """Plans, reports and job logs of the trials."""
    vocabulary_layouts: tuple[VocabularyLayout, ...] | None = None
    """Where the searched plans may put the vocabulary layers; None: the search's default."""


def pool_size(settings: TuneSettings) -> int:
    """How many ranked plans the search returns for the tuner to choose from."""
    return settings.top_k * (SPREAD_POOL if settings.select is Selection.SPREAD else 1)


def select_plans(ranked: tuple[Plan, ...], settings: TuneSettings) -> tuple[Plan, ...]:
    """The plans to run, fastest predicted first (see Selection)."""
    k = settings.top_k
    if settings.select is Selection.TOP or len(ranked) <= k:
        return ranked[:k]
    if k == 1:
        return ranked[:1]
    picks = sorted({round(i * (len(ranked) - 1) / (k - 1)) for i in range(k)})
    return tuple(ranked[i] for i in picks)
