"""Which of the search's plans `planner tune` runs (``TuneSettings.top_k`` and ``select``)."""

from planner.schemas import Plan
from planner.schemas.settings import Selection, TuneSettings

SPREAD_POOL = 5
"""A spread selection picks its k plans from this many times k of the fastest."""


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
