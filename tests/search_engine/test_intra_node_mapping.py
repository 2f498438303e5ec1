"""The intra-node mapping refiner: on nodes whose local links differ, tensor-parallel groups move
off a slow local pair and the plan is priced faster; nodes described alike share a permutation,
a node order chosen before is kept, uniform links cost no evaluation, and on a 4-device node the
refiner is as fast as the best of all 24 local permutations priced one by one."""

from dataclasses import replace
from itertools import permutations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.groups import tensor_groups
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import ClusterProfile, DeviceKind, DeviceMap, Layout, LinkMatrix, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.device_mapping import DeviceMappingRefiner, distinct_links
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.intra_node_mapping import (
    MAX_CANDIDATES,
    IntraNodeMappingRefiner,
    candidate_permutations,
    compose,
    slot_levels,
)
from planner.search_engine.runner import DEFAULT_REFINERS, run_search
from planner.search_engine.strategy import Candidate

MODEL = load_model("tiny-gpt")
FAST, SLOW, LATENCY_S = 100e9, 5e9, 1e-6


def matrix(bandwidth: np.ndarray) -> LinkMatrix:
    """An explicit matrix of ``bandwidth`` (zero diagonal) at ``LATENCY_S`` on every link."""
    n = len(bandwidth)
    return LinkMatrix(
        size=n,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple((LATENCY_S,) * n for _ in range(n)),
    )


def slow_pair(devices: int, pair: tuple[int, int] = (0, 1)) -> LinkMatrix:
    """Every local link at ``FAST`` but the pair's, at ``SLOW`` (a measured matrix's slow pair)."""
    bandwidth = np.full((devices, devices), FAST)
    np.fill_diagonal(bandwidth, 0.0)
    bandwidth[pair[0], pair[1]] = bandwidth[pair[1], pair[0]] = SLOW
    return matrix(bandwidth)


def cluster_of(nodes: int, links: LinkMatrix, **update: object) -> ClusterProfile:
    """DGX A100 nodes of ``links.size`` devices linked inside by ``links``, without the preset's
    intra-node collective curves (which would price every local group alike)."""
    raw = load_cluster(f"dgx-a100-80g:{nodes}").model_dump()
    raw.update(devices_per_node=links.size, intra_node_links=links.model_dump(), collectives=(), **update)
    return ClusterProfile.model_validate(raw)


def layout(t: int, d: int, p: int = 1, **kw: object) -> Layout:
    return Layout(
        data_parallel_degree=d, tensor_parallel_degree=t, pipeline_parallel_degree=p, micro_batch_size=1, **kw
    )


def priced(evaluate: Evaluator, lay: Layout) -> Candidate:
    return Candidate(lay, evaluate(lay))


def local_tensor_pairs(lay: Layout, devices_per_node: int) -> set[frozenset[int]]:
    """The local devices of every tensor-parallel group."""
    return {frozenset(dev % devices_per_node for dev in g.devices) for g in tensor_groups(lay)}


def test_slot_levels_are_the_tensor_runs_then_the_next_axis_strided() -> None:
    levels = slot_levels(layout(2, 4), 4)  # tp runs of 2; dp members 2 a node, strided by 2
    assert [lv.tolist() for lv in levels] == [[[0, 1], [2, 3]], [[0, 2], [1, 3]]]
    levels = slot_levels(layout(2, 1, 4), 8)  # dp of 1 has no ring: the pipeline axis is next
    assert [lv.tolist() for lv in levels] == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]]]
    assert [lv.tolist() for lv in slot_levels(layout(1, 8), 8)] == [[list(range(8))]]
    assert [lv.tolist() for lv in slot_levels(layout(8, 1), 4)] == [[[0, 1, 2, 3]]]  # a tp group's local part
    assert slot_levels(layout(3, 1), 8) == ()  # runs of 3 do not tile 8 devices


def test_compose_permutes_inside_each_node_and_keeps_the_node_order() -> None:
    node_order = DeviceMap(devices=(4, 5, 6, 7, 0, 1, 2, 3))  # rank block 0 on node 1
    perms = np.array([[0, 2, 3, 1], [1, 0, 2, 3]])
    assert compose(node_order, 8, 4, perms).devices == (5, 4, 6, 7, 0, 2, 3, 1)
    assert compose(DeviceMap(), 8, 4, np.array([[0, 1, 2, 3]] * 2)).is_identity


def test_tp2_groups_leave_the_slow_local_pair_and_are_priced_faster() -> None:
    cluster = cluster_of(2, slow_pair(4))
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster)
    identity = priced(evaluate, layout(2, 4))
    assert frozenset({0, 1}) in local_tensor_pairs(identity.layout, 4)
    mapped = IntraNodeMappingRefiner().refine(identity, evaluate, Budget(), seed=0)
    assert frozenset({0, 1}) not in local_tensor_pairs(mapped.layout, 4)
    # The slowest tensor group ran over 5 GB/s and now runs over 100 GB/s: its all-reduces, all
    # of one size, take at least 20x less transfer time (latency aside), here > 3x less in all.
    assert mapped.estimate.time.tensor_parallel_comm_s < identity.estimate.time.tensor_parallel_comm_s / 3
    assert mapped.estimate.time.data_parallel_comm_s <= identity.estimate.time.data_parallel_comm_s
    assert mapped.estimate.step_time_s < identity.estimate.step_time_s
    # Both nodes are described alike, so both run the same local permutation.
    devices = mapped.layout.device_map.devices
    assert [dev - 4 for dev in devices[4:]] == list(devices[:4])


def test_a_stack_that_runs_no_device_map_is_not_offered_one_and_no_map_is_priced() -> None:
    # The slow pair that the test above maps around, under a stack that numbers its ranks as the
    # launcher starts them (every export target): both mapping refiners return the candidate
    # after asking the stack once, without pricing a map.
    cluster = cluster_of(2, slow_pair(4))
    asked: list[Layout] = []

    def identity_only(lay: Layout) -> None:
        asked.append(lay)
        if not lay.device_map.is_identity:
            raise InfeasibleConfigError("megatron cannot express the plan's device map")

    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster, admit=identity_only)
    identity = priced(evaluate, layout(2, 4))
    evaluations = evaluate.evaluations
    for refiner in (IntraNodeMappingRefiner(), DeviceMappingRefiner()):
        asked.clear()
        assert refiner.refine(identity, evaluate, Budget(), seed=0) is identity
        assert len(asked) <= 1 and evaluate.evaluations == evaluations
    assert len([lay for lay in asked if not lay.device_map.is_identity]) <= 1


def test_tp4_groups_take_the_two_nvlink_islands_of_an_8_device_node() -> None:
    # Islands {0, 2, 4, 6} and {1, 3, 5, 7} at 100 GB/s inside, 10 GB/s between: under the identity
    # each tp4 group (local 0-3, 4-7) crosses between islands.
    island = np.arange(8) % 2
    bandwidth = np.where(island[:, None] == island[None, :], FAST, 10e9)
    np.fill_diagonal(bandwidth, 0.0)
    cluster = cluster_of(1, matrix(bandwidth))
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster)
    identity = priced(evaluate, layout(4, 2))
    mapped = IntraNodeMappingRefiner().refine(identity, evaluate, Budget(), seed=0)
    assert local_tensor_pairs(mapped.layout, 8) == {frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})}
    assert mapped.estimate.step_time_s < identity.estimate.step_time_s


def test_uniform_intra_node_links_are_skipped_without_evaluating() -> None:
    cluster = load_cluster("dgx-a100-80g:2")
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster)
    candidate = priced(evaluate, layout(2, 8))
    before = evaluate.evaluations
    assert IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0) is candidate
    assert evaluate.evaluations == before


def test_links_that_differ_within_their_measured_spread_are_left_alone() -> None:
    # The slow pair at 5 GB/s against 100 GB/s: 95% apart. Measured with a spread of 0.99 (IQR over
    # median) on every link, that is noise: no map is priced. With 0.3, it is a slow pair.
    def measured(spread: float) -> LinkMatrix:
        links = slow_pair(4)
        spreads = tuple(tuple(0.0 if i == j else spread for j in range(4)) for i in range(4))
        return links.model_copy(update={"bandwidth_spread": spreads})

    assert not distinct_links(measured(0.99)) and distinct_links(measured(0.3))
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster_of(2, measured(0.99)))
    candidate = priced(evaluate, layout(2, 4))
    before = evaluate.evaluations
    assert IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0) is candidate
    assert evaluate.evaluations == before
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster_of(2, measured(0.3)))
    candidate = priced(evaluate, layout(2, 4))
    assert not IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0).layout.device_map.is_identity
    # A CPU host's ranks all talk through its one memory: however its pairs measured, nothing to place.
    cpu = cluster_of(2, measured(0.3))
    cpu = cpu.model_copy(update={"device": cpu.device.model_copy(update={"kind": DeviceKind.CPU})})
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cpu)
    candidate = priced(evaluate, layout(2, 4))
    assert IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0) is candidate


def test_nodes_described_alike_share_one_permutation_and_a_node_order_is_kept() -> None:
    # Nodes 1 and 3 are overridden with their slow pair at (2, 3); nodes 0 and 2 keep (0, 1).
    override = {"nodes": (1, 3), "intra_node_links": slow_pair(4, (2, 3)).model_dump()}
    cluster = cluster_of(4, slow_pair(4), node_overrides=(override,))
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=16, seq_len=128), cluster)
    node_order = DeviceMap(devices=tuple(n * 4 + k for n in (1, 0, 3, 2) for k in range(4)))
    candidate = priced(evaluate, layout(2, 8, device_map=node_order))
    mapped = IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0)
    devices = mapped.layout.device_map.devices
    blocks = [devices[b * 4 : b * 4 + 4] for b in range(4)]
    assert [block[0] // 4 for block in blocks] == [1, 0, 3, 2]  # every block stays on its node
    local = [tuple(dev % 4 for dev in block) for block in blocks]
    assert local[0] == local[2] and local[1] == local[3]  # nodes 1, 3 alike; nodes 0, 2 alike
    for block, slow in zip(local, ((2, 3), (0, 1), (2, 3), (0, 1)), strict=True):
        assert {frozenset(block[:2]), frozenset(block[2:])}.isdisjoint({frozenset(slow)})
    assert mapped.estimate.step_time_s < candidate.estimate.step_time_s


def test_a_node_of_16_devices_is_mapped_by_greedy_chains() -> None:
    perms = candidate_permutations(slow_pair(16), slot_levels(layout(2, 8), 16))
    assert all(sorted(p) == list(range(16)) for p in perms)
    # The first has the fastest tensor level: no pair of slots (2k, 2k + 1) on the slow pair (the
    # identity, on the front for its data-parallel rings, may follow).
    assert all({perms[0][k], perms[0][k + 1]} != {0, 1} for k in range(0, 16, 2))


def test_a_search_with_the_default_refiners_returns_a_plan_mapped_inside_nodes() -> None:
    names = [r.name for r in DEFAULT_REFINERS]
    assert names.index(IntraNodeMappingRefiner.name) == names.index(DeviceMappingRefiner.name) + 1
    cluster, training = cluster_of(2, slow_pair(4)), TrainingSpec(global_batch_size=16, seq_len=128)
    without = tuple(r for r in DEFAULT_REFINERS if r.name != IntraNodeMappingRefiner.name)
    plain = run_search(
        MODEL, training, cluster, ExhaustiveSearch(), SearchSettings(top_k=1, seed=0), refiners=without
    ).ranked[0]
    mapped = run_search(MODEL, training, cluster, ExhaustiveSearch(), SearchSettings(top_k=1, seed=0)).ranked[0]
    assert not mapped.layout.device_map.is_identity
    assert mapped.estimate.step_time_s < plain.estimate.step_time_s


BANDWIDTHS = st.sampled_from([5e9, 25e9, 100e9])


@st.composite
def four_device_matrices(draw: st.DrawFn) -> LinkMatrix:
    """4 x 4 matrices of few distinct bandwidths (ties common), symmetric or not."""
    symmetric = draw(st.booleans())
    bandwidth = np.zeros((4, 4))
    for i, j in permutations(range(4), 2):
        if symmetric and i > j:
            bandwidth[i, j] = bandwidth[j, i]
        else:
            bandwidth[i, j] = draw(BANDWIDTHS)
    return matrix(bandwidth)


@settings(max_examples=15, deadline=None)
@given(links=four_device_matrices(), shape=st.sampled_from([(2, 2), (4, 1), (1, 4)]))
def test_refiner_matches_the_best_of_every_local_permutation(links: LinkMatrix, shape: tuple[int, int]) -> None:
    # One node of 4 devices: the refiner against all 24 local permutations, each priced.
    evaluate = Evaluator(MODEL, TrainingSpec(global_batch_size=8, seq_len=128), cluster_of(1, links))
    candidate = priced(evaluate, layout(*shape))
    refined = IntraNodeMappingRefiner().refine(candidate, evaluate, Budget(), seed=0)
    times = []
    for perm in permutations(range(4)):
        try:
            times.append(evaluate(replace(candidate.layout, device_map=DeviceMap(devices=perm))).step_time_s)
        except InfeasibleConfigError:
            continue
    assert refined.estimate.step_time_s <= candidate.estimate.step_time_s
    assert refined.estimate.step_time_s <= min(times) * (1 + 1e-9)


def _front_by_definition(links: LinkMatrix, levels: tuple[np.ndarray, ...]) -> tuple[tuple[int, ...], ...]:
    """``candidate_permutations`` as its docstring defines it, permutation by permutation."""
    n = links.size
    scored: dict[tuple[float, ...], tuple[tuple[float, ...], int, tuple[int, ...]]] = {}
    for index, perm in enumerate(permutations(range(n))):
        bandwidths, latencies = [], []
        for level in levels:
            edges = [
                (perm[ring[k]], perm[ring[(k + 1) % len(ring)]]) for ring in level.tolist() for k in range(len(ring))
            ]
            bandwidths.append(min(links.link(a, b).bandwidth_bytes_per_s for a, b in edges))
            latencies.append(max(links.link(a, b).latency_s for a, b in edges))
        point, best = tuple(bandwidths), (tuple(latencies), index, perm)
        if point not in scored or best[:2] < scored[point][:2]:
            scored[point] = best
    front = [p for p in scored if not any(all(q[i] >= p[i] for i in range(len(p))) and q != p for q in scored)]
    front.sort(key=lambda p: (-p[0], scored[p][1]))
    if len(front) > MAX_CANDIDATES:
        front = [front[round(k * (len(front) - 1) / (MAX_CANDIDATES - 1))] for k in range(MAX_CANDIDATES)]
    return tuple(scored[p][2] for p in front)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([(2, 3), (3, 2), (2, 1, 3), (6, 1)]),
    coarse=st.booleans(),
)
def test_candidate_permutations_are_the_pareto_front_by_definition(
    seed: int, shape: tuple[int, ...], coarse: bool
) -> None:
    # 6 devices, 720 permutations: bandwidths drawn from few values (many ties, so which permutation
    # stands for a point matters) or from many, latencies too.
    rng = np.random.default_rng(seed)
    values = rng.choice([50e9, 100e9, 200e9], (6, 6)) if coarse else rng.uniform(10e9, 400e9, (6, 6))
    np.fill_diagonal(values, 0.0)
    latency = rng.choice([1e-6, 2e-6], (6, 6))
    links = LinkMatrix(
        size=6,
        bandwidth_bytes_per_s=tuple(map(tuple, values.tolist())),
        latency_s=tuple(map(tuple, latency.tolist())),
    )
    levels = slot_levels(layout(shape[0], shape[1], *shape[2:]), 6)
    assert levels
    assert candidate_permutations(links, levels) == _front_by_definition(links, levels)
