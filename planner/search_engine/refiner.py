"""Refiners: each improves one aspect of a finalist layout that the search space leaves at its
default (the layer split today; expert placement, the rank-to-device mapping and the vocabulary
split next).

A refiner is one small object with one method, like a strategy (``strategy.SearchStrategy``):
it asks the evaluator for what it needs (cost tables, estimates), never imports the cost models,
and returns a candidate that fits and is at least as fast as the one it was given (that one if
it finds nothing better). ``run_search`` passes every finalist through its refiners in order, so
a later refiner starts from what the earlier ones chose. A new refiner is a module holding its
CP-SAT model and a class satisfying ``Refiner`` (see ``layer_split``), added to the list given to
``run_search``.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Candidate

if TYPE_CHECKING:  # OR-Tools is imported where a refiner solves (``cp_sat_solver``)
    from ortools.sat.python import cp_model


class Refiner(Protocol):
    """Improves one finalist through an Evaluator within a Budget."""

    name: ClassVar[str]

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """A candidate that fits and is at least as fast as ``candidate`` (``candidate`` itself if
        nothing better is found)."""
        ...


def refine_all(
    finalists: Sequence[Candidate], refiners: Sequence[Refiner], evaluate: Evaluator, budget: Budget, *, seed: int
) -> list[Candidate]:
    """Every finalist passed through every refiner, in the order given."""
    refined = []
    for candidate in finalists:
        for refiner in refiners:
            candidate = refiner.refine(candidate, evaluate, budget, seed=seed)
        refined.append(candidate)
    return refined


DEFAULT_SOLVE_TIME_S = 10.0
"""A refiner's CP-SAT time limit when the budget sets none."""


def cp_sat_solver(budget: Budget, *, seed: int) -> "cp_model.CpSolver":
    """A CP-SAT solver limited by ``budget`` (time, workers) and seeded: every refiner solves with one.
    OR-Tools is imported here, not with the module: its import loads pandas, 0.4 s that every
    ``planner`` process (a ``planner run`` rank among them) paid without solving anything."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = budget.max_time_s if budget.max_time_s is not None else DEFAULT_SOLVE_TIME_S
    solver.parameters.num_workers = budget.workers
    solver.parameters.random_seed = seed
    return solver
