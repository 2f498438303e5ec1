"""Expert placement: hand-worked metrics, CP-SAT against enumeration on small cases, every
placement valid (hypothesis), the decomposition against round-robin, and the refiner."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from cost_models.layout_validity import check_layout
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.routing_trace import summarize, synthetic_trace
from planner.schemas import ExpertPlacement, Layout, RoutingStats, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.routing import placement_metrics
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.expert_placement import (
    ExpertPlacementRefiner,
    _Layer,
    _rebalance,
    expert_rank_nodes,
    place_experts,
    replica_counts,
)
from planner.search_engine.strategy import Budget, Candidate

BUDGET = Budget(max_time_s=10.0, workers=1)


def _stats(ids: list[list[list[int]]], experts: int) -> RoutingStats:
    return summarize(np.asarray(ids), experts, "hand")


# Four tokens, two layers, four experts, top-1: token t goes to expert t in layer 0 and to
# expert (t + 1) % 4 in layer 1. Round-robin puts experts 0, 2 on rank 0 and 1, 3 on rank 1, so
# every token changes rank between the layers; {0, 1} | {2, 3} in layer 0 and {1, 2} | {3, 0}
# in layer 1 keeps all four local.
HAND = _stats([[[t], [(t + 1) % 4]] for t in range(4)], 4)


def test_metrics_are_the_hand_worked_values() -> None:
    rr = ExpertPlacement.round_robin(4, 2, 2)
    metrics = placement_metrics(HAND, rr, (0, 1))
    assert (metrics.cross_rank_tokens, metrics.cross_node_tokens) == (4.0, 4.0)
    assert (metrics.hottest_rank_tokens, metrics.mean_rank_tokens) == (4.0, 4.0)  # 2 tokens per rank per layer
    local = ExpertPlacement(slots=(((0, 1), (2, 3)), ((1, 2), (3, 0))))
    assert placement_metrics(HAND, local, (0, 1)).cross_rank_tokens == 0.0
    assert placement_metrics(HAND, rr, (0, 0)).cross_node_tokens == 0.0  # one node: nothing crosses nodes


def test_a_replica_splits_its_tokens_and_its_traffic_evenly() -> None:
    # One token, experts 0 -> 1, both experts on both ranks: each copy gets half a token, and
    # the halves on different ranks (half of the four quarter-pairs) cross.
    stats = _stats([[[0], [1]]], 2)
    placement = ExpertPlacement(slots=(((0, 1), (0, 1)),) * 2)
    assert placement.share(0).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    metrics = placement_metrics(stats, placement, (0, 1))
    assert metrics.cross_rank_tokens == pytest.approx(0.5)  # 1 - (0.5 * 0.5 + 0.5 * 0.5)
    assert metrics.hottest_rank_tokens == pytest.approx(1.0)  # 0.5 per rank in each of two layers


def test_the_solver_finds_the_hand_worked_optimum() -> None:
    placed = place_experts(HAND, (0, 1), BUDGET, load_tolerance=0.0)
    assert placement_metrics(HAND, placed, (0, 1)).cross_rank_tokens == 0.0


def test_replicas_go_to_the_hottest_experts() -> None:
    assert replica_counts(np.array([90, 30, 10, 10]), 6, 2).tolist() == [2, 2, 1, 1]
    assert replica_counts(np.array([90, 1, 1, 1]), 8, 4).tolist() == [4, 2, 1, 1]  # at most one copy per rank


def _layer_options(copies: np.ndarray, ranks: int, slots: int) -> list[np.ndarray]:
    options = []
    for choice in itertools.product(*(itertools.combinations(range(ranks), int(c)) for c in copies)):
        hosted = np.zeros((len(copies), ranks), dtype=bool)
        for e, chosen in enumerate(choice):
            hosted[e, list(chosen)] = True
        if (hosted.sum(axis=0) == slots).all():
            options.append(hosted)
    return options


def _objective(stats: RoutingStats, placement: ExpertPlacement, nodes: tuple[int, ...]) -> tuple[float, float]:
    """(tokens above each layer's target, cross-rank + 4 x cross-node tokens), load_tolerance 0."""
    excess = 0.0
    for layer in range(stats.num_layers):
        tokens = stats.expert_tokens[layer]
        loads = tokens @ placement.share(layer)
        copies = np.array([sum(e in rank for rank in placement.slots[layer]) for e in range(stats.num_experts)])
        target = max(math.ceil(tokens.sum() / len(nodes)), float((tokens / copies).max()))
        excess += max(0.0, float(loads.max()) - target)
    metrics = placement_metrics(stats, placement, nodes)
    return excess, metrics.cross_rank_tokens + 4 * metrics.cross_node_tokens


CASES = [  # (experts, layers, ranks, k, spare slots, nodes of the ranks, seed)
    (4, 2, 2, 1, 0, (0, 1), 0),
    (4, 2, 2, 2, 0, (0, 1), 1),
    (4, 3, 2, 1, 0, (0, 0), 2),
    (4, 2, 2, 2, 1, (0, 1), 3),
    (6, 2, 3, 1, 0, (0, 0, 1), 4),
    (4, 2, 4, 2, 0, (0, 0, 1, 1), 5),
    (4, 2, 2, 1, 1, (0, 0), 6),
]


@pytest.mark.parametrize(("experts", "layers", "ranks", "k", "spare", "nodes", "seed"), CASES)
def test_cp_sat_matches_enumeration_on_small_cases(
    experts: int, layers: int, ranks: int, k: int, spare: int, nodes: tuple[int, ...], seed: int
) -> None:
    ids = synthetic_trace(
        tokens=40, layers=layers, num_experts=experts, experts_per_token=k, skew=1.2, affinity=0.6, seed=seed
    )
    stats = summarize(ids, experts, "small")
    placed = place_experts(stats, nodes, BUDGET, spare_slots=spare, load_tolerance=0.0, seed=seed)
    slots = experts // ranks + spare
    # Enumerate every placement with the solver's copy counts (the apportionment is tested above).
    per_layer = [
        _layer_options(replica_counts(stats.expert_tokens[layer], experts + ranks * spare, ranks), ranks, slots)
        for layer in range(layers)
    ]
    best = min(_objective(stats, _as_placement(choice), nodes) for choice in itertools.product(*per_layer))
    ours = _objective(stats, placed, nodes)
    assert ours[0] == pytest.approx(best[0], abs=1e-6)
    assert ours[1] == pytest.approx(best[1], abs=1e-6)


def _as_placement(hosted: tuple[np.ndarray, ...]) -> ExpertPlacement:
    return ExpertPlacement(
        slots=tuple(tuple(tuple(np.flatnonzero(h[:, r]).tolist()) for r in range(h.shape[1])) for h in hosted)
    )


@settings(max_examples=20, deadline=None)
@given(
    experts_per_rank=st.integers(1, 4),
    ranks=st.sampled_from([1, 2, 4, 8]),
    layers=st.integers(1, 5),
    k=st.integers(1, 3),
    spare=st.integers(0, 2),
    skew=st.floats(0.0, 2.0),
    affinity=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_every_placement_is_valid(
    experts_per_rank: int, ranks: int, layers: int, k: int, spare: int, skew: float, affinity: float, seed: int
) -> None:
    experts = experts_per_rank * ranks
    spare = min(spare, experts * (ranks - 1) // ranks)
    k = min(k, experts)
    ids = synthetic_trace(
        tokens=64, layers=layers, num_experts=experts, experts_per_token=k, skew=skew, affinity=affinity, seed=seed
    )
    stats = summarize(ids, experts, "prop")
    nodes = tuple(r // 4 for r in range(ranks))
    placement = place_experts(stats, nodes, Budget(max_time_s=0.3), spare_slots=spare, seed=seed)
    assert (placement.num_layers, placement.num_ranks, placement.num_experts) == (layers, ranks, experts)
    assert placement.slots_per_rank == experts_per_rank + spare
    for layer in range(layers):
        hosted = [e for rank in placement.slots[layer] for e in rank]
        assert sorted(set(hosted)) == list(range(experts))  # every expert at least once
        copies = [hosted.count(e) for e in range(experts)]
        assert copies == replica_counts(stats.expert_tokens[layer], experts + ranks * spare, ranks).tolist()
    layout = Layout(
        data_parallel_degree=ranks,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=ranks,
        expert_placement=placement,
    )
    assert TypeAdapter(Layout).validate_json(TypeAdapter(Layout).dump_json(layout)) == layout


def test_the_decomposition_cuts_traffic_and_the_hottest_load_against_round_robin() -> None:
    # 64 experts over 16 layers on 16 ranks (2 nodes), top-2, skew 1.0, affinity 0.9: layer by layer.
    ids = synthetic_trace(tokens=4000, layers=16, num_experts=64, experts_per_token=2, skew=1.0, affinity=0.9, seed=0)
    stats = summarize(ids, 64, "medium")
    nodes = tuple(r // 8 for r in range(16))
    placed = place_experts(stats, nodes, Budget(max_time_s=4.0), seed=0)
    ours = placement_metrics(stats, placed, nodes)
    base = placement_metrics(stats, ExpertPlacement.round_robin(64, 16, 16), nodes)
    assert ours.cross_rank_tokens <= 0.7 * base.cross_rank_tokens
    assert ours.cross_node_tokens < base.cross_node_tokens
    assert ours.hottest_rank_tokens < base.hottest_rank_tokens


def test_rebalancing_swaps_the_hottest_ranks_copies_for_lighter_ones() -> None:
    # Four experts of 5, 4, 2 and 1 tokens, two slots a rank, mean 6, target 6: the locality
    # greedy's {0, 1} | {2, 3} carries 9 against 3. Swapping expert 0 for expert 3 leaves 5 | 7,
    # expert 1 for expert 2 7 | 5, and expert 0 for 2 or expert 1 for 3 (the first taken) 6 | 6.
    layer = _Layer(copies=np.ones(4, dtype=np.int64), load=np.array([5, 4, 2, 1]), target=6)
    greedy = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    kept = np.zeros((4, 2), dtype=np.int64)
    placed = _rebalance(layer, kept, greedy)
    assert placed.tolist() == [[False, True], [True, False], [True, False], [False, True]]
    assert greedy[0, 0]  # the greedy's placement is left as it was
    # Of two swaps that cool the pair alike, the one that keeps more tokens local: expert 1
    # keeps 3 tokens on rank 1, expert 3 none on rank 0 (loads 4 and 4 for 1 | 2 and 1 | 0 alike).
    even = _Layer(copies=np.ones(4, dtype=np.int64), load=np.array([3, 3, 1, 1]), target=4)
    kept = np.array([[0, 0], [0, 3], [0, 0], [0, 0]], dtype=np.int64)
    assert _rebalance(even, kept, np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool))[1].tolist() == [False, True]


@settings(max_examples=60, deadline=None)
@given(
    experts_per_rank=st.integers(1, 6),
    ranks=st.sampled_from([2, 4, 8, 32]),
    spare=st.integers(0, 2),
    skew=st.floats(0.0, 2.0),
    seed=st.integers(0, 1000),
)
def test_rebalancing_never_heats_the_hottest_rank_and_keeps_every_copy(
    experts_per_rank: int, ranks: int, spare: int, skew: float, seed: int
) -> None:
    experts = experts_per_rank * ranks
    spare = min(spare, experts * (ranks - 1) // ranks)
    rng = np.random.default_rng(seed)
    tokens = np.rint(1000 * (rng.permutation(experts) + 1.0) ** -skew).astype(np.int64)
    copies = replica_counts(tokens, experts + ranks * spare, ranks)
    load = -(-tokens * 4 // copies)
    layer = _Layer(copies=copies, load=load, target=int(np.ceil(load @ copies / ranks)))
    # a random valid start: each expert's copies on distinct ranks, every rank full
    hosted = np.zeros((experts, ranks), dtype=bool)
    free = np.full(ranks, experts_per_rank + spare)
    for e in sorted(range(experts), key=lambda e: (-copies[e], rng.random())):
        order = sorted(range(ranks), key=lambda r: (-free[r], rng.random()))  # most free slots first
        chosen = order[: copies[e]]
        hosted[e, chosen], free[chosen] = True, free[chosen] - 1
    assert (free == 0).all()
    kept = rng.integers(0, 50, size=(experts, ranks))
    placed = _rebalance(layer, kept, hosted)
    assert (placed.sum(axis=0) == hosted.sum(axis=0)).all()  # every rank keeps its slots
    assert (placed.sum(axis=1) == copies).all()  # every expert its copies, on distinct ranks
    assert (layer.load @ placed).max() <= (layer.load @ hosted).max()


def test_candidate_ranks_keep_a_large_placement_valid_and_better() -> None:
    # 128 experts on 64 ranks: beyond full candidates, each expert tries only a few ranks.
    ids = synthetic_trace(tokens=2000, layers=3, num_experts=128, experts_per_token=1, skew=0.8, affinity=0.9, seed=1)
    stats = summarize(ids, 128, "large")
    nodes = tuple(r // 8 for r in range(64))
    placed = place_experts(stats, nodes, Budget(max_time_s=3.0), seed=0)
    base = placement_metrics(stats, ExpertPlacement.round_robin(128, 64, 3), nodes)
    assert placement_metrics(stats, placed, nodes).cross_rank_tokens < 0.5 * base.cross_rank_tokens


def test_a_placement_must_match_the_layouts_ep_and_the_models_experts() -> None:
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=64, seq_len=1024)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=4,
    )
    with pytest.raises(SchemaError, match="expert_parallel_degree=4"):
        replace(layout, expert_placement=ExpertPlacement.round_robin(8, 2, 32))
    check_layout(model, training, cluster, replace(layout, expert_placement=ExpertPlacement.round_robin(8, 4, 32)))
    with pytest.raises(InfeasibleConfigError, match="31 MoE layers"):
        check_layout(model, training, cluster, replace(layout, expert_placement=ExpertPlacement.round_robin(8, 4, 31)))
    with pytest.raises(InfeasibleConfigError, match="16 experts"):
        check_layout(model, training, cluster, replace(layout, expert_placement=ExpertPlacement.round_robin(16, 4, 32)))


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ((((0, 1), (2,)),), "slots on its ranks"),
        ((((0, 1), (1, 3)),), "no copy of experts \\[2\\]"),
        ((((0, 0), (1, 2)),), "twice on ranks \\[0\\]"),
        ((((0, -1), (1, 2)),), "whole numbers >= 0"),
        ((), "at least one MoE layer"),
    ],
)
def test_a_malformed_placement_is_refused(slots: tuple[tuple[tuple[int, ...], ...], ...], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        ExpertPlacement(slots=slots)


def test_expert_ranks_map_to_nodes_through_the_geometry_and_device_map() -> None:
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=4,
    )
    # Expert-parallel rank i is replica i: global rank 2i, device 2i; 4 devices per node.
    assert expert_rank_nodes(layout, 4) == (0, 0, 1, 1)
    assert expert_rank_nodes(layout, 16) == (0, 0, 0, 0)
    # Folded over the stage's d t ranks: expert-parallel rank i is global rank i, one node of 4.
    folded = replace(layout, expert_tensor_parallel_degree=1, sequence_parallel=True)
    assert expert_rank_nodes(folded, 4) == (0, 0, 0, 0)
    assert expert_rank_nodes(replace(folded, expert_parallel_degree=8), 4) == (0, 0, 0, 0, 1, 1, 1, 1)


def _refuse_placement(layout: Layout) -> None:
    if layout.expert_placement is not None:
        raise InfeasibleConfigError("megatron cannot express the plan's expert placement")


def test_the_refiner_places_the_experts_and_keeps_the_estimate() -> None:
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
    evaluate = Evaluator(model, TrainingSpec(global_batch_size=64, seq_len=1024), cluster)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=8,
        zero_stage=1,
    )
    candidate = Candidate(layout, evaluate(layout))
    ids = synthetic_trace(tokens=2000, layers=32, num_experts=8, experts_per_token=2, skew=1.0, affinity=0.8, seed=0)
    refiner = ExpertPlacementRefiner(stats=summarize(ids, 8, model.name), max_time_s=2.0)
    refined = refiner.refine(candidate, evaluate, Budget(), seed=0)
    assert refined.layout.expert_placement is not None
    assert refined.layout == replace(layout, expert_placement=refined.layout.expert_placement)
    assert refined.estimate.step_time_s <= candidate.estimate.step_time_s
    assert refined.estimate == evaluate(refined.layout)
    no_ep = replace(layout, expert_parallel_degree=1)
    assert refiner.refine(Candidate(no_ep, candidate.estimate), evaluate, Budget(), seed=0).layout is no_ep
    # A stack that places experts its own way (every export target) is asked first: nothing is solved.
    refused = Evaluator(
        model,
        TrainingSpec(global_batch_size=64, seq_len=1024),
        cluster,
        admit=lambda lay: _refuse_placement(lay),
    )
    fresh = ExpertPlacementRefiner(stats=summarize(ids, 8, model.name), max_time_s=2.0)
    assert fresh.refine(Candidate(layout, refused(layout)), refused, Budget(), seed=0).layout is layout
    assert not fresh._placed
    wrong = ExpertPlacementRefiner(stats=summarize(ids[:, :4], 8, model.name))
    with pytest.raises(SchemaError, match="4 MoE layers of 8 experts"):
        wrong.refine(candidate, evaluate, Budget(), seed=0)
