"""The one small interface every search strategy implements, and what it returns."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from planner.schemas import Estimate, Layout
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace

Progress = Callable[[int, int | None], None]
"""Called as progress(done, total) while a strategy works; total is None when unknown."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A layout that fits, with its estimate."""

    layout: Layout
    estimate: Estimate


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    """What a strategy found: feasible candidates, fastest first."""

    strategy: str
    feasible: tuple[Candidate, ...]
    evaluated: int
    """Layouts the strategy asked the evaluator for."""
    complete: bool
    """Whether the strategy covered its whole space (False when the budget cut it short)."""
    space_size: int | None = None
    """The candidates in the space, where the strategy counted them on its way (``SearchSpace.size``)."""
    outpaced: int = 0
    """Candidates not evaluated because they could not be among the fastest asked for (a bound
    on their step time was above them: ``exhaustive._Fastest``)."""


class SearchStrategy(Protocol):
    """Explores a SearchSpace through an Evaluator within a Budget."""

    name: ClassVar[str]

    def search(
        self,
        space: SearchSpace,
        evaluate: Evaluator,
        budget: Budget,
        *,
        seed: int,
        progress: Progress | None = None,
        keep: int | None = None,
    ) -> SearchResult:
        """Return the feasible layouts found, fastest first: the fastest ``keep`` of them (None:
        all), as ``fastest_first`` ranks them."""
        ...


def fastest_first(candidates: list[Candidate], keep: int | None = None) -> tuple[Candidate, ...]:
    """Candidates sorted by predicted step time (then by peak memory, then by their order in
    ``candidates``, to break ties stably); the first ``keep`` of them (None: all)."""
    ranked = sorted(candidates, key=lambda c: (c.estimate.step_time_s, c.estimate.peak_memory_bytes))
    return tuple(ranked if keep is None else ranked[:keep])
