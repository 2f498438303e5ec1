"""Layers per pipeline stage with OR-Tools CP-SAT: minimize the slowest stage subject to every
stage fitting in memory; ``LayerSplitRefiner`` applies it to a finalist (``refiner``).

The stages that hold the embedding and the output layer do more work per micro-batch and the
first stage holds the most micro-batches in flight, so an even split is rarely best. Costs come
from the evaluator as affine functions of each stage's layer count (``SplitCosts``); this module
never imports the cost models. Model sections: data -> variables -> constraints -> objective ->
solve (as OR-Tools' line_balancing_sat example).

Where a finalist recomputes, a second variable per stage counts the layers it recomputes in full
(``Layout.recompute_layers``; its time and memory affine in that count too: ``RecomputeCosts``),
chosen with the split: a stage with more micro-batches in flight saves more by each (``balance_split``).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from planner.schemas import Layout, Recompute, Schedule
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
    stage's usable memory (one figure for every stage, or one per stage): ``balance_split``'s
    layers."""
    split = balance_split(costs, num_layers, usable_memory_bytes, budget, seed=seed)
    return None if split is None else split.layers


@dataclass(frozen=True, slots=True)
class Split:
    """Layers per stage and, where the costs price recompute (``SplitCosts.recompute``), the
    layers of each stage recomputed in full (its first ones)."""

    layers: tuple[int, ...]
    recompute_layers: tuple[int, ...] | None


def balance_split(
    costs: SplitCosts,
    num_layers: int,
    usable_memory_bytes: float | Sequence[float],
    budget: Budget,
    *,
    seed: int = 0,
) -> Split | None:
    """Layers per stage, and with ``costs.recompute`` the layers each recomputes, minimizing the
    slowest stage's time; None if no split fits in each stage's usable memory (one figure for
    every stage, or one per stage). Of the splits as fast, the one that spends least time
    recomputing (a second solve with the slowest stage fixed).

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
    rc = costs.recompute
    # A recomputed layer's time rounded up, the memory it saves down, what a backward rebuilds up.
    again_t = [math.ceil(t / TIME_UNIT_S) for t in rc.time_per_layer_s] if rc else [0] * p
    saved_m = [math.floor(m / MEMORY_UNIT_BYTES) for m in rc.memory_saved_per_layer_bytes] if rc else [0] * p
    rebuilt_m = [math.ceil(m / MEMORY_UNIT_BYTES) for m in rc.memory_rebuilt_bytes] if rc else [0] * p

    from ortools.sat.python import cp_model  # with the solver (refiner.cp_sat_solver): not with the module

    model = cp_model.CpModel()
    # Variables: layers of each stage; those it recomputes, and whether all; the slowest stage's time.
    layers = {s: model.new_int_var(1, max_layers, f"layers[{s}]") for s in stages}
    again = {s: model.new_int_var(0, max_layers, f"recomputed[{s}]") if rc else 0 for s in stages}
    every = {s: model.new_bool_var(f"every[{s}]") if rc else 0 for s in stages}
    stage_t = {s: base_t[s] + per_t[s] * layers[s] + again_t[s] * again[s] for s in stages}
    slowest = model.new_int_var(
        0, max(b + (k + a) * max_layers for b, k, a in zip(base_t, per_t, again_t, strict=True)), "slowest"
    )

    # Constraints: all layers placed once.
    model.add(sum(layers.values()) == num_layers)
    for s in stages:
        if rc:  # a stage recomputes some of its own layers; all of them only where ``every`` says so
            model.add(again[s] <= layers[s])
            model.add(again[s] <= layers[s] - 1 + every[s])
        # Each stage fits in the usable memory.
        model.add(base_m[s] + per_m[s] * layers[s] - saved_m[s] * again[s] + rebuilt_m[s] * every[s] <= cap_m[s])
        # The slowest stage bounds every stage.
        model.add(slowest >= stage_t[s])

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
    if rc:  # as fast, the least time recomputing
        model.add(slowest <= int(solver.value(slowest)))
        for s in stages:  # (the layers keep the even split's hint)
            variable = again[s]
            if not isinstance(variable, int):
                model.add_hint(variable, int(solver.value(variable)))
        model.minimize(sum(again_t[s] * again[s] for s in stages))
        second = cp_sat_solver(budget, seed=seed)
        if second.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            solver = second
    found = tuple(int(solver.value(layers[s])) for s in stages)
    return Split(layers=found, recompute_layers=tuple(int(solver.value(again[s])) for s in stages) if rc else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSplitRefiner:
    """Splits a finalist's layers over its pipeline stages with ``balance_layers``; keeps the even
    split when that is as fast or the CP-SAT split does not fit. One model chunk per stage only."""

    name: ClassVar[str] = "layer-split"
    max_time_s: float = 2.0
    """CP-SAT wall time per finalist at most (less if the search's budget is smaller)."""

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """The candidate with its layers split by CP-SAT, or with the embedding and loss counted
        as layers (``geometry.accounted_split``), whichever is fastest and fits, when faster; then,
        where it recomputes, with the layers each stage recomputes in full chosen with the split
        (``_partially_recomputed``), when faster."""
        layout = candidate.layout
        if layout.virtual_stages > 1:
            return self._uneven_instead(candidate, evaluate, budget, seed=seed)
        split_budget = Budget(
            max_time_s=min(budget.max_time_s or self.max_time_s, self.max_time_s), workers=budget.workers
        )
        if layout.pipeline_parallel_degree > 1 and layout.recompute_layers is None:
            accounted = accounted_split(evaluate.model.num_hidden_layers, layout.pipeline_parallel_degree)
            if min(accounted) >= 1:
                candidate = _faster(candidate, replace(layout, layer_split=accounted), evaluate)
            split = balance_layers(
                evaluate.split_costs(layout),
                evaluate.model.num_hidden_layers,
                evaluate.stage_usable_bytes(layout),
                split_budget,
                seed=seed,
            )
            if split is not None:
                candidate = _faster(candidate, replace(layout, layer_split=split), evaluate)
        return _partially_recomputed(candidate, evaluate, split_budget, seed=seed)

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


def _partially_recomputed(candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
    """A candidate that recomputes (selective, full, or some layers of each stage), or the layout
    without recompute with its layers split and each stage's first layers recomputed in full as
    CP-SAT chooses them together (``balance_split``; ``Layout.recompute_layers``), whichever is faster:
    the stages holding more micro-batches in flight recompute more. Counts of none or of every
    layer are plain no or full recompute."""
    layout = candidate.layout
    if layout.recompute is Recompute.NONE or not evaluate.partial_recompute:
        return candidate
    plain = replace(layout, recompute=Recompute.NONE, recompute_layers=None, layer_split=None)
    split = balance_split(
        evaluate.split_costs(plain, partial_recompute=True),
        evaluate.model.num_hidden_layers,
        evaluate.stage_usable_bytes(plain),
        budget,
        seed=seed,
    )
    if split is None or split.recompute_layers is None:
        return candidate
    held = None if plain.pipeline_parallel_degree == 1 else split.layers
    if not any(split.recompute_layers):
        chosen = replace(plain, layer_split=held)
    elif split.recompute_layers == split.layers:
        chosen = replace(plain, recompute=Recompute.FULL, layer_split=held)
    else:
        chosen = replace(plain, recompute=Recompute.FULL, layer_split=held, recompute_layers=split.recompute_layers)
    return _faster(candidate, chosen, evaluate)


def _faster(candidate: Candidate, layout: Layout, evaluate: Evaluator) -> Candidate:
    """``layout`` evaluated, if it fits and is faster than ``candidate``; else ``candidate``."""
    try:
        est = evaluate(layout)
    except InfeasibleConfigError:
        return candidate
    return Candidate(layout, est) if est.step_time_s < candidate.estimate.step_time_s else candidate
