"""Layers per pipeline stage with OR-Tools CP-SAT: minimize the slowest stage subject to every
stage fitting in memory; ``LayerSplitRefiner`` applies it to a finalist (``refiner``).

The stages that hold the embedding and the output layer do more work per micro-batch and the
first stage holds the most micro-batches in flight, so an even split is rarely best. Costs come
from the evaluator as affine functions of each stage's layer count (``SplitCosts``); this module
never imports the cost models. Model sections: data -> variables -> constraints -> objective ->
solve (as OR-Tools' line_balancing_sat example).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from ortools.sat.python import cp_model

from planner.schemas import Layout, Schedule
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import accounted_split
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator, SplitCosts
from planner.search_engine.refiner import cp_sat_solver
from planner.search_engine.strategy import Candidate

TIME_UNIT_S = 1e-7
"""CP-SAT works in integers: times in units of 0.1 microsecond."""
MEMORY_UNIT_BYTES = 1024
"""... and memory in KiB."""
UNEQUAL_STAGES = 0.01
"""Stages whose time per layer differs by more than this share run at unequal speeds."""


def balance_layers(
    costs: SplitCosts,
    num_layers: int,
    usable_memory_bytes: float | Sequence[float],
    budget: Budget,
    *,
    seed: int = 0,
) -> tuple[int, ...] | None:
    """Layers per stage minimizing the slowest stage's time; None if no split fits in each
    stage's usable memory (one figure for every stage, or one per stage).

    Every stage gets at least one layer. The even split (extra layers to the middle) is the hint.
    """
    # Data.
    stages = range(len(costs.time_base_s))
    p = len(stages)
    if num_layers < p:
        return None
    base_t = [math.ceil(t / TIME_UNIT_S) for t in costs.time_base_s]
    per_t = [math.ceil(t / TIME_UNIT_S) for t in costs.time_per_layer_s]
    base_m = [math.ceil(m / MEMORY_UNIT_BYTES) for m in costs.memory_base_bytes]
    per_m = [math.ceil(m / MEMORY_UNIT_BYTES) for m in costs.memory_per_layer_bytes]
    usable = [usable_memory_bytes] * p if isinstance(usable_memory_bytes, float | int) else list(usable_memory_bytes)
    cap_m = [math.floor(u / MEMORY_UNIT_BYTES) for u in usable]
    max_layers = num_layers - (p - 1)

    model = cp_model.CpModel()
    # Variables: layers of each stage; the slowest stage's time.
    layers = {s: model.new_int_var(1, max_layers, f"layers[{s}]") for s in stages}
    slowest = model.new_int_var(0, max(b + k * max_layers for b, k in zip(base_t, per_t, strict=True)), "slowest")

    # Constraints: all layers placed once.
    model.add(sum(layers.values()) == num_layers)
    # Each stage fits in the usable memory.
    for s in stages:
        model.add(base_m[s] + per_m[s] * layers[s] <= cap_m[s])
    # The slowest stage bounds every stage.
    for s in stages:
        model.add(slowest >= base_t[s] + per_t[s] * layers[s])

    # Objective.
    model.minimize(slowest)
    base, extra = divmod(num_layers, p)
    for s in stages:
        model.add_hint(layers[s], base + (1 if 1 <= s <= extra else 0))

    # Solve.
    solver = cp_sat_solver(budget, seed=seed)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return tuple(int(solver.value(layers[s])) for s in stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSplitRefiner:
    """Splits a finalist's layers over its pipeline stages with ``balance_layers``; keeps the even
    split when that is as fast or the CP-SAT split does not fit. One model chunk per stage only."""

    name: ClassVar[str] = "layer-split"
    max_time_s: float = 2.0
    """CP-SAT wall time per finalist at most (less if the search's budget is smaller)."""

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """The candidate with its layers split by CP-SAT, or with the embedding and loss counted
        as layers (``geometry.accounted_split``), whichever is fastest and fits, when faster."""
        layout = candidate.layout
        if layout.pipeline_parallel_degree == 1:
            return candidate
        if layout.virtual_stages > 1:
            return self._uneven_instead(candidate, evaluate, budget, seed=seed)
        accounted = accounted_split(evaluate.model.num_hidden_layers, layout.pipeline_parallel_degree)
        if min(accounted) >= 1:
            candidate = _faster(candidate, replace(layout, layer_split=accounted), evaluate)
        split_budget = Budget(
            max_time_s=min(budget.max_time_s or self.max_time_s, self.max_time_s), workers=budget.workers
        )
        split = balance_layers(
            evaluate.split_costs(layout),
            evaluate.model.num_hidden_layers,
            evaluate.stage_usable_bytes(layout),
            split_budget,
            seed=seed,
        )
        if split is None:
            return candidate
        return _faster(candidate, replace(layout, layer_split=split), evaluate)

    def _uneven_instead(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """An interleaved candidate whose stages run at unequal speeds (a cluster of mixed device
        types, ``cost_models.stage_devices``), or the same layout under 1F1B with its layers split
        by CP-SAT, whichever is faster: interleaving spreads the layers evenly over the stages,
        so the faster stages wait for the slower. Costs nothing on a cluster of one device type."""
        if not evaluate.cluster.has_mixed_devices:
            return candidate
        plain = replace(candidate.layout, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1, layer_split=None)
        per_layer_s = evaluate.split_costs(plain).time_per_layer_s
        if max(per_layer_s) <= min(per_layer_s) * (1.0 + UNEQUAL_STAGES):
            return candidate
        try:
            start = Candidate(plain, evaluate(plain))
        except InfeasibleConfigError:
            return candidate
        refined = self.refine(start, evaluate, budget, seed=seed)
        return refined if refined.estimate.step_time_s < candidate.estimate.step_time_s else candidate


def _faster(candidate: Candidate, layout: Layout, evaluate: Evaluator) -> Candidate:
    """``layout`` evaluated, if it fits and is faster than ``candidate``; else ``candidate``."""
    try:
        est = evaluate(layout)
    except InfeasibleConfigError:
        return candidate
    return Candidate(layout, est) if est.step_time_s < candidate.estimate.step_time_s else candidate
