"""Expert placement with OR-Tools CP-SAT: which experts each expert-parallel rank hosts, per
MoE layer, from a routing trace's ``RoutingStats``; ``ExpertPlacementRefiner`` applies it to a
finalist (``refiner``).

What is optimized (all counts in routed tokens; ``schemas.routing.placement_metrics`` computes them):

- **Load** of rank r in layer l: the tokens its experts receive, an expert's tokens split evenly
  over its replicas, sum_e n[l, e] * copies of e on r / copies of e. The *hottest-rank load* is
  sum over layers of max over ranks: layers run one after another, each as slow as its hottest
  rank. Each layer has a target: (1 + ``load_tolerance``) x the mean, but never above
  round-robin's hottest rank nor below the lower bound max(mean, the heaviest replica).
- **Cross-rank tokens**: a token whose expert i in layer l and expert j in layer l + 1 sit on
  different ranks must move between them (ExFlow's inter-layer affinity: the token stays where
  its expert computed it and goes straight on, Yao et al. 2024). For each co-activated pair the
  share that moves is 1 - sum_r share[i, r] * share[j, r], so cross-rank tokens =
  sum_l sum_{i,j} C[l, i, j] * (1 - sum_r share_l[i, r] * share_{l+1}[j, r]). *Cross-node tokens*
  likewise with each node's share (ranks map to nodes through the layout's geometry and device
  map). The solver minimizes, lexicographically, the tokens by which the layers' hottest ranks
  exceed their targets, then cross-rank + ``cross_node_weight`` x cross-node tokens.

Replicas: ``spare_slots`` extra slots per rank per layer hold replicas of hot experts. How many
copies each expert gets is the apportionment (D'Hondt) that minimizes the heaviest replica's
tokens, max_e n_e / copies_e, which is optimal for that bound; where the copies go is solved.

Decomposition (to place 256 experts x 61 layers on 256 ranks in seconds): small problems are one
CP-SAT model over all layers (exact: ``tests/search_engine/test_expert_placement.py`` checks it against
enumeration); larger ones are solved layer by layer with the previous layer fixed, which makes
the traffic term linear, and beyond ``_FULL_CANDIDATES`` (experts x ranks) each expert may only
go to its greedy ranks or the few ranks where it keeps most tokens local. A greedy placement
(hottest expert first, to the rank that keeps most of its tokens local, within the target) is the
hint and the fallback. Model sections: data -> variables -> constraints -> objective -> solve.
"""

from __future__ import annotations  # the CP-SAT types in annotations: OR-Tools loads where a model is solved

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt

from planner.schemas import ExpertPlacement, Layout, RoutingStats
from planner.schemas.device_map import node_numbers
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import expert_rank_of
from planner.schemas.routing import placement_metrics
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.refiner import cp_sat_solver
from planner.search_engine.strategy import Candidate

log = logging.getLogger(__name__)

Hosted = npt.NDArray[np.bool_]
"""(E, ep): whether rank r hosts expert e in one layer."""
_EXACT_SIZE = 256
"""Up to layers x experts x ranks this large, one CP-SAT model over all layers (exact)."""
_FULL_CANDIDATES = 4096
"""Up to experts x ranks this large, every expert may go to every rank in the per-layer models."""
_BEST_RANKS = 8
"""Beyond that, an expert may go to its greedy ranks and the this many ranks where it keeps most
tokens local."""
_MAX_SCALE = 3600
"""CP-SAT works in integers: token counts times the lcm of the copy counts, squared, at most this."""
_REBALANCE_SWAPS = 256
"""Swaps ``_rebalance`` makes in one layer at most."""
_REBALANCE_PARTNERS = 16
"""The coolest ranks ``_rebalance`` swaps the hottest rank's copies with."""

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def replica_counts(expert_tokens: npt.NDArray[np.int64], total_slots: int, ranks: int) -> npt.NDArray[np.int64]:
    """Copies of each expert filling ``total_slots``: each spare slot goes to the expert whose
    replicas carry the most tokens (D'Hondt), at most one copy per rank."""
    copies = np.ones(len(expert_tokens), dtype=np.int64)
    heap = [(-float(n), e) for e, n in enumerate(expert_tokens)]
    heapq.heapify(heap)
    for _ in range(total_slots - len(expert_tokens)):
        while copies[heap[0][1]] >= ranks:
            heapq.heappop(heap)
        _, e = heapq.heappop(heap)
        copies[e] += 1
        heapq.heappush(heap, (-float(expert_tokens[e]) / float(copies[e]), e))
    return copies


@dataclass(frozen=True, slots=True)
class _Layer:
    """One MoE layer's data in CP-SAT's integer units."""

    copies: npt.NDArray[np.int64]
    load: npt.NDArray[np.int64]
    """Scaled tokens one copy of each expert receives."""
    target: int
    """Scaled tokens a rank may carry before the excess counts (module docstring)."""


def _layers(stats: RoutingStats, ranks: int, spare_slots: int, tolerance: float) -> tuple[list[_Layer], int]:
    slots = stats.num_experts + ranks * spare_slots
    copies = [replica_counts(n, slots, ranks) for n in stats.expert_tokens]
    scale = math.lcm(*(int(c) for layer in copies for c in set(layer.tolist()))) ** 2
    scale = scale if scale <= _MAX_SCALE else _MAX_SCALE
    round_robin = ExpertPlacement.round_robin(stats.num_experts, ranks, 1).share(0)
    layers = []
    for n, c in zip(stats.expert_tokens, copies, strict=True):
        load = -(-n * scale // c)  # rounded up, so that rounding never hides an excess
        mean = math.ceil(int(load @ c) / ranks)
        lower = max(mean, int(load.max()))
        target = max(lower, min(math.floor((1 + tolerance) * mean), int(np.ceil((n * scale) @ round_robin).max())))
        layers.append(_Layer(copies=c, load=load.astype(np.int64), target=target))
    return layers, scale


def _kept(
    together: npt.NDArray[np.int64],
    prev: Hosted,
    layer: _Layer,
    prev_copies: npt.NDArray[np.int64],
    node_of_rank: npt.NDArray[np.int64],
    node_weight: int,
    scale: int,
) -> npt.NDArray[np.int64]:
    """(E, ep) scaled tokens a copy of expert j keeps local (rank, and node with its weight) on
    rank r, given the previous layer's placement: the linear traffic term."""
    # Each expert sits on a few ranks: sum its successors' rows into those ranks' columns rather
    # than multiply by a mostly-zero (E, ep) share matrix.
    source, rank = np.nonzero(prev)
    rows = together[source] / prev_copies[source, None]
    to_rank = np.zeros((prev.shape[1], together.shape[1]))
    np.add.at(to_rank, rank, rows)
    to_node = np.zeros((int(node_of_rank.max()) + 1, together.shape[1]))
    np.add.at(to_node, node_of_rank[rank], rows)
    to_rank, to_node = to_rank.T, to_node[node_of_rank].T
    return np.rint(scale * (to_rank + node_weight * to_node) / layer.copies[:, None]).astype(np.int64)


def _greedy(layer: _Layer, kept: npt.NDArray[np.int64], slots: int) -> Hosted:
    """Hottest copies first, each to the free rank keeping most tokens local within the target,
    else to the least loaded free rank."""
    experts, ranks = kept.shape
    hosted = np.zeros((experts, ranks), dtype=bool)
    free, load = np.full(ranks, slots), np.zeros(ranks, dtype=np.int64)
    for e in sorted(range(experts), key=lambda e: (-layer.copies[e], -layer.load[e], e)):
        for _ in range(layer.copies[e]):
            open_ = (free > 0) & ~hosted[e]
            if not open_.any():  # every free slot is on a rank that hosts e already: swap one out
                r_free = int(np.flatnonzero(free > 0)[0])
                r_out, f = next(
                    (int(q), int(f))
                    for q in np.flatnonzero(~hosted[e])
                    for f in np.flatnonzero(hosted[:, q])
                    if not hosted[f, r_free]
                )
                hosted[f, r_out], hosted[f, r_free] = False, True
                load[r_out] -= layer.load[f]
                load[r_free] += layer.load[f]
                free[r_out], free[r_free] = free[r_out] + 1, free[r_free] - 1
                open_ = (free > 0) & ~hosted[e]
            fits = open_ & (load + layer.load[e] <= layer.target)
            if fits.any():  # most tokens kept local, then the least loaded (the fraction is < 1)
                score = np.where(fits, kept[e] - load / (load.sum() + layer.load[e] + 1.0), -np.inf)
            else:
                score = np.where(open_, -load.astype(np.float64), -np.inf)
            r = int(np.argmax(score))
            hosted[e, r], free[r], load[r] = True, free[r] - 1, load[r] + layer.load[e]
    return _rebalance(layer, kept, hosted)


def _rebalance(layer: _Layer, kept: npt.NDArray[np.int64], hosted: Hosted) -> Hosted:
    """``hosted`` with the hottest rank cooled by swaps while it exceeds the target: one of its
    copies for a lighter copy on another rank (neither rank hosting the other's expert), the swap
    that leaves the pair's hotter rank coolest, then the one that keeps most tokens local. Placing
    hottest first to the rank that keeps most tokens local fills ranks unevenly once their slots
    run out: on DeepSeek-V3's 256 experts over 8 ranks (a skewed synthetic trace) the greedy's
    hottest ranks summed 30% above the mean, and CP-SAT needed 30 s to bring them to 5% (at the
    refiner's 5 s, split over 58 layers, it improved on none). Each swap leaves both ranks below the
    hottest's load; at most ``_REBALANCE_SWAPS`` swaps, with the ``_REBALANCE_PARTNERS`` coolest
    ranks (256 ranks of a DeepSeek-V3-sized placement would otherwise be searched at each swap)."""
    hosted = hosted.copy()
    load = layer.load @ hosted
    for _ in range(_REBALANCE_SWAPS):
        h = int(np.argmax(load))
        if load[h] <= layer.target:
            break
        mine = np.flatnonzero(hosted[:, h])  # copies on the hottest rank
        cool = np.argsort(load, kind="stable")[:_REBALANCE_PARTNERS]  # the ranks that may take one
        cool = cool[cool != h]
        on = hosted[:, cool]
        # (copy e of mine, expert f, rank r of cool): f on r, e not on r, f not on h
        movable = on[None, :, :] & ~on[mine][:, None, :] & ~hosted[:, h][None, :, None]
        delta = layer.load[mine][:, None, None] - layer.load[None, :, None]  # what h sheds and r takes
        after = np.maximum(load[h] - delta, load[cool][None, None, :] + delta)
        ok = movable & (delta > 0) & (after < load[h])
        if not ok.any():
            break
        # tokens kept local gained: e on r and f on h, less e on h and f on r (a tie-break under one token)
        kc = kept[:, cool]
        gain = kc[mine][:, None, :] + kept[:, h][None, :, None] - kept[mine, h][:, None, None] - kc[None, :, :]
        score = np.where(ok, gain / (np.abs(gain).max() + 1.0) - after, -np.inf)
        i, f, j = np.unravel_index(int(np.argmax(score)), score.shape)
        e, r, moved = int(mine[i]), int(cool[j]), int(delta[i, f, 0])
        hosted[e, h], hosted[e, r], hosted[f, r], hosted[f, h] = False, True, False, True
        load[h] -= moved
        load[r] += moved
    return hosted


def _solve(
    layers: list[_Layer],
    hints: list[Hosted],
    fixed_kept: npt.NDArray[np.int64] | None,
    together: list[npt.NDArray[np.int64]],
    node_of_rank: npt.NDArray[np.int64],
    node_weight: int,
    scale: int,
    candidates: list[list[int]] | None,
    budget: Budget,
    seed: int,
) -> list[Hosted]:
    """One CP-SAT model over consecutive layers; ``fixed_kept`` prices the first against the
    fixed layer before it, ``together[w]`` is the co-activation of window layers w and w + 1."""
    # Data.
    experts, ranks = hints[0].shape
    data = _Data(
        layers=layers,
        window=range(len(layers)),
        experts=experts,
        ranks=ranks,
        slots=int(hints[0][:, 0].sum()),
        allowed=[candidates[e] if candidates else range(ranks) for e in range(experts)],
        nodes=range(int(node_of_rank.max()) + 1),
        node_of_rank=node_of_rank,
    )
    from ortools.sat.python import cp_model  # with the solver (refiner.cp_sat_solver): not with the module

    model = cp_model.CpModel()
    variables = _variables(model, data)
    _constraints(model, data, variables)
    _objective(model, data, variables, fixed_kept, together, node_weight=node_weight, scale=scale)
    for w in data.window:
        for e in range(experts):
            for r in data.allowed[e]:
                model.add_hint(variables.x[w, e, r], bool(hints[w][e, r]))

    # Solve.
    solver = cp_sat_solver(budget, seed=seed)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return hints
    placed = [np.zeros((experts, ranks), dtype=bool) for _ in data.window]
    for (w, e, r), var in variables.x.items():
        placed[w][e, r] = bool(solver.value(var))
    return placed


@dataclass(frozen=True, slots=True, kw_only=True)
class _Data:
    """What one CP-SAT model of ``_solve`` is built from."""

    layers: list[_Layer]
    window: range
    """The window's layers, by index."""
    experts: int
    ranks: int
    slots: int
    """Experts each rank hosts in each layer."""
    allowed: list[Sequence[int]]
    """By expert: the ranks it may go to (every rank without candidates)."""
    nodes: range
    node_of_rank: npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class _Variables:
    """The model's variables, keyed by (window layer, expert, rank or node)."""

    x: dict[tuple[int, int, int], cp_model.IntVar]
    """Whether rank r hosts expert e in window layer w."""
    excess: dict[int, cp_model.IntVar]
    """Tokens by which window layer w's hottest rank exceeds its target."""
    on_node: dict[tuple[int, int, int], cp_model.IntVar]
    """Copies of expert e on node n in window layer w (only over several nodes and layers)."""


def _variables(model: cp_model.CpModel, data: _Data) -> _Variables:
    """Variables: whether rank r hosts expert e in window layer w; each layer's excess; copies of
    e on node n, tied to those on its ranks."""
    layers, window, allowed = data.layers, data.window, data.allowed
    x = {
        (w, e, r): model.new_bool_var(f"x[{w},{e},{r}]")
        for w in window
        for e in range(data.experts)
        for r in allowed[e]
    }
    excess = {w: model.new_int_var(0, int(layers[w].load @ layers[w].copies), f"excess[{w}]") for w in window}
    on_node: dict[tuple[int, int, int], cp_model.IntVar] = {}
    if len(data.nodes) > 1 and len(layers) > 1:
        for w in window:
            for e in range(data.experts):
                for n in data.nodes:
                    here = [x[w, e, r] for r in allowed[e] if data.node_of_rank[r] == n]
                    on_node[w, e, n] = model.new_int_var(0, len(here), f"on_node[{w},{e},{n}]")
                    # Copies of e on node n are those on its ranks.
                    model.add(on_node[w, e, n] == sum(here))
    return _Variables(x, excess, on_node)


def _constraints(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """Constraints: every expert's copies, at most one per rank; every rank's slots filled, its
    tokens within the layer's target plus excess."""
    from ortools.sat.python import cp_model

    layers, allowed, x = data.layers, data.allowed, variables.x
    # Each expert has its copies, at most one per rank.
    for w in data.window:
        for e in range(data.experts):
            model.add(cp_model.LinearExpr.sum([x[w, e, r] for r in allowed[e]]) == int(layers[w].copies[e]))
    # Every rank fills its slots.
    by_rank: dict[int, list[int]] = {r: [] for r in range(data.ranks)}
    for e in range(data.experts):
        for r in allowed[e]:
            by_rank[r].append(e)
    for w in data.window:
        for r in range(data.ranks):
            hosted = [x[w, e, r] for e in by_rank[r]]
            model.add(cp_model.LinearExpr.sum(hosted) == data.slots)
            # The layer's excess bounds every rank's tokens above the target.
            tokens = cp_model.LinearExpr.weighted_sum(hosted, [int(layers[w].load[e]) for e in by_rank[r]])
            model.add(tokens <= layers[w].target + variables.excess[w])


def _objective(
    model: cp_model.CpModel,
    data: _Data,
    variables: _Variables,
    fixed_kept: npt.NDArray[np.int64] | None,
    together: list[npt.NDArray[np.int64]],
    *,
    node_weight: int,
    scale: int,
) -> None:
    """Objective: tokens kept on their rank (and, weighted, their node) between consecutive
    layers, after any excess, which outweighs all the traffic there is (lexicographic)."""
    from ortools.sat.python import cp_model

    x, on_node, allowed, ranks = variables.x, variables.on_node, data.allowed, data.ranks
    kept: list[cp_model.LinearExprT] = []
    most = 0  # the most that kept can be
    if fixed_kept is not None:
        most += int(fixed_kept.sum())
        terms = [
            (x[0, e, r], int(fixed_kept[e, r])) for e in range(data.experts) for r in allowed[e] if fixed_kept[e, r]
        ]
        kept.append(cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms]))
    for w in data.window[:-1]:
        c_now, c_next = data.layers[w].copies, data.layers[w + 1].copies
        for i, j in zip(*np.nonzero(together[w]), strict=True):
            weight = scale * int(together[w][i, j]) / (int(c_now[i]) * int(c_next[j]))
            for r in set(allowed[i]) & set(allowed[j]):
                same = model.new_bool_var(f"same_rank[{w},{i},{j},{r}]")
                model.add_implication(same, x[w, i, r])
                model.add_implication(same, x[w + 1, j, r])
                kept.append(round(weight) * same)
                most += round(weight)
            for n in data.nodes if on_node else ():
                # Copies of i and of j that share node n: the product of their counts there.
                both = model.new_int_var(0, ranks * ranks, f"same_node[{w},{i},{j},{n}]")
                model.add_multiplication_equality(both, [on_node[w, i, n], on_node[w + 1, j, n]])
                kept.append(round(node_weight * weight) * both)
                most += round(node_weight * weight) * ranks * ranks
    # Any excess outweighs all the traffic there is: lexicographic.
    over = cp_model.LinearExpr.sum(list(variables.excess.values()))
    model.maximize(cp_model.LinearExpr.sum(kept) - (most + 1) * over)


def place_experts(
    stats: RoutingStats,
    node_of_rank: tuple[int, ...],
    budget: Budget,
    *,
    spare_slots: int = 0,
    load_tolerance: float = 0.05,
    cross_node_weight: int = 4,
    seed: int = 0,
) -> ExpertPlacement:
    """The placement of ``stats``'s experts on ``len(node_of_rank)`` ranks (module docstring).

    Args:
        stats: the trace's routing statistics.
        node_of_rank: node of each expert-parallel rank.
        budget: CP-SAT wall time for the whole placement (split over the layers) and workers.
        spare_slots: extra slots per rank per layer, filled with replicas of hot experts.
        load_tolerance: share above the mean load a rank may carry while traffic is reduced.
        cross_node_weight: how many cross-rank tokens one cross-node token is worth.
        seed: CP-SAT's random seed.

    Raises:
        SchemaError: the ranks do not divide the experts, or too many spare slots.
    """
    ranks, experts = len(node_of_rank), stats.num_experts
    if ranks < 1 or experts % ranks or not 0 <= spare_slots <= experts * (ranks - 1) // ranks:
        raise SchemaError(
            f"cannot place {experts} experts on ep={ranks} ranks with {spare_slots} spare slots each: ep must "
            f"divide the experts and the spare slots be at most {experts * (ranks - 1) // max(ranks, 1)}"
        )
    nodes = np.asarray(node_of_rank, dtype=np.int64)
    layers, scale = _layers(stats, ranks, spare_slots, load_tolerance)
    slots = experts // ranks + spare_slots
    together = [stats.coactivation_matrix(layer) for layer in range(stats.num_layers - 1)]

    def kept_after(layer: int, prev: Hosted) -> npt.NDArray[np.int64]:
        return _kept(
            together[layer - 1], prev, layers[layer], layers[layer - 1].copies, nodes, cross_node_weight, scale
        )

    if stats.num_layers * experts * ranks <= _EXACT_SIZE:
        hints: list[Hosted] = []
        for layer in range(stats.num_layers):
            kept = kept_after(layer, hints[-1]) if layer else np.zeros((experts, ranks), dtype=np.int64)
            hints.append(_greedy(layers[layer], kept, slots))
        placed = _solve(layers, hints, None, together, nodes, cross_node_weight, scale, None, budget, seed)
        return _placement(placed)
    per_layer = Budget(max_time_s=(budget.max_time_s or 10.0) / stats.num_layers, workers=budget.workers)
    # The first layer has no predecessor: only its load matters, and the greedy balances it.
    placed = [_greedy(layers[0], np.zeros((experts, ranks), dtype=np.int64), slots)]
    for layer in range(1, stats.num_layers):
        prev = placed[-1]
        kept = kept_after(layer, prev)
        hint = _greedy(layers[layer], kept, slots)  # again: the previous layer may have moved
        candidates = None if experts * ranks <= _FULL_CANDIDATES else _candidates(hint, kept)
        solved = _solve(
            [layers[layer]], [hint], kept, [], nodes, cross_node_weight, scale, candidates, per_layer, seed
        )[0]
        placed.append(max((hint, solved), key=lambda h: _score(layers[layer], kept, h)))
    return _placement(placed)


def _score(layer: _Layer, kept: npt.NDArray[np.int64], hosted: Hosted) -> tuple[int, int]:
    """(-excess over the target, tokens kept local): what the per-layer model maximizes."""
    return -max(0, int((layer.load @ hosted).max()) - layer.target), int(np.sum(kept * hosted))


def _candidates(hint: Hosted, kept: npt.NDArray[np.int64]) -> list[list[int]]:
    """Ranks each expert may go to: its greedy ranks and the ranks where a copy keeps most
    tokens local (its strongest predecessors' ranks and their nodes)."""
    best = np.argpartition(-kept, _BEST_RANKS - 1, axis=1)[:, :_BEST_RANKS]
    return [sorted(set(np.flatnonzero(hint[e]).tolist()) | set(best[e].tolist())) for e in range(hint.shape[0])]


def _placement(placed: list[Hosted]) -> ExpertPlacement:
    return ExpertPlacement(
        slots=tuple(tuple(tuple(np.flatnonzero(h[:, r]).tolist()) for r in range(h.shape[1])) for h in placed)
    )


def expert_rank_nodes(layout: Layout, devices_per_node: int) -> tuple[int, ...]:
    """The node of each expert-parallel rank of the layout's first expert-parallel group (first
    stage, first tensor shard; folded, the stage's first ep ranks), numbered from 0 in order of
    appearance."""
    ep = layout.expert_parallel_degree
    ranks = (expert_rank_of(layout, 0, 0, i) for i in range(ep))
    return node_numbers((layout.device_map.device_of(r) for r in ranks), devices_per_node)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ExpertPlacementRefiner:
    """Places a finalist's experts from a routing trace (``place_experts``); keeps the finalist's
    layout when the placed one does not fit or is estimated slower. The evaluator prices the
    placed layout at its busiest rank under the same trace (``cost_models.expert_parallel``):
    what the placement changes there is that rank's expert work and all-to-all bytes and the
    memory of replica slots; the inter-layer cross-rank tokens the solver also cuts are what a
    dispatcher that keeps tokens at their expert between layers would save (ExFlow), not the
    training runtime, which returns every token to its own rank after each MoE layer."""

    name: ClassVar[str] = "expert-placement"
    stats: RoutingStats
    """The routing trace's statistics."""
    replicas: int = 0
    """Spare slots per expert-parallel rank per layer, for replicas of hot experts."""
    max_time_s: float = 5.0
    """CP-SAT wall time per finalist at most (less if the search's budget is smaller)."""
    _placed: dict[tuple[tuple[int, ...], float, int], ExpertPlacement] = field(default_factory=dict, repr=False)
    """Placements already solved: finalists sharing ep and its nodes share them."""

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """The candidate with its experts placed, when that fits and is no slower."""
        layout, model = candidate.layout, evaluate.model
        if layout.expert_parallel_degree == 1 or not model.is_moe:
            return candidate
        self.stats.check_model(model)
        nodes = expert_rank_nodes(layout, evaluate.cluster.devices_per_node)
        if self.replicas > model.num_local_experts - model.num_local_experts // len(nodes):
            return candidate  # this ep has fewer free slots per rank than replicas asked: others may hold them
        probe = ExpertPlacement.round_robin(model.num_local_experts, len(nodes), self.stats.num_layers)
        if not evaluate.admits(replace(layout, expert_placement=probe)):
            return candidate  # the stack places experts its own way (every export target): nothing to solve
        placement_budget = Budget(
            max_time_s=min(budget.max_time_s or self.max_time_s, self.max_time_s), workers=budget.workers
        )
        key = (nodes, placement_budget.max_time_s or self.max_time_s, seed)
        if key not in self._placed:
            self._placed[key] = place_experts(self.stats, nodes, placement_budget, spare_slots=self.replicas, seed=seed)
        placement = self._placed[key]
        placed = replace(layout, expert_placement=placement)
        try:
            est = evaluate(placed)
        except InfeasibleConfigError:
            return candidate
        if est.step_time_s > candidate.estimate.step_time_s:
            return candidate
        ours = placement_metrics(self.stats, placement, nodes)
        base = placement_metrics(
            self.stats, ExpertPlacement.round_robin(model.num_local_experts, len(nodes), self.stats.num_layers), nodes
        )
        log.info(
            "%s: placed experts; hottest rank %.0f vs %.0f tokens, cross-rank %.0f vs %.0f, cross-node %.0f vs %.0f "
            "(round-robin)",
            layout.describe(),
            ours.hottest_rank_tokens,
            base.hottest_rank_tokens,
            ours.cross_rank_tokens,
            base.cross_rank_tokens,
            ours.cross_node_tokens,
            base.cross_node_tokens,
        )
        return Candidate(placed, est)
