"""Exhaustive search with memory-bound pruning.

Every candidate group of the space's axes (``SearchSpace.groups``: layouts that differ only in
recomputation) is tried in order of increasing recomputation; the first that fits dominates the
rest of its group (same layout, more time, less memory), so they are not priced. Memory is
checked before time, and before memory the model states alone (``Evaluator.cannot_fit``): a
layout they rule out is counted as asked, as if evaluated, but costs a memoized look-up, so the
result (the closest miss included) and the budget's meaning are those of evaluating it.
"""

import time
from typing import ClassVar

from planner.schemas.errors import InfeasibleConfigError
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import Budget, Candidate, Progress, SearchResult, fastest_first


class ExhaustiveSearch:
    """Try every candidate; exact, and fast enough for thousands of GPUs."""

    name: ClassVar[str] = "exhaustive"

    def search(
        self, space: SearchSpace, evaluate: Evaluator, budget: Budget, *, seed: int, progress: Progress | None = None
    ) -> SearchResult:
        """Evaluate every group until the budget runs out."""
        del seed  # deterministic
        groups = list(space.groups())
        start, found, asked, complete = time.perf_counter(), [], 0, True
        for done, group in enumerate(groups):
            for layout in group:  # the budget counts layouts: a group can hold several
                if _spent(budget, asked, start):
                    complete = False
                    break
                asked += 1
                if evaluate.cannot_fit(layout):
                    continue
                try:
                    found.append(Candidate(layout, evaluate(layout)))
                    break
                except InfeasibleConfigError:
                    continue
            if not complete:
                break
            if progress is not None and done % 64 == 0:
                progress(done, len(groups))
        if progress is not None:
            progress(len(groups), len(groups))
        return SearchResult(strategy=self.name, feasible=fastest_first(found), evaluated=asked, complete=complete)


def _spent(budget: Budget, asked: int, start: float) -> bool:
    if budget.max_trials is not None and asked >= budget.max_trials:
        return True
    return budget.max_time_s is not None and time.perf_counter() - start >= budget.max_time_s
