"""The node-order mapping refiner: never slower than the candidate, as fast as the best of every
node order on a cluster with one slow node link, and no evaluation at all on uniform links. Its
chain over the node matrix's arrays walks as a walk reading ``LinkMatrix.link`` pair by pair, and
clusters of 1,024 nodes are mapped. Links measured to differ within their noise keep the order."""

from dataclasses import replace
from itertools import permutations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import DType, Layout, LinkMatrix, TrainingSpec
from planner.schemas.links import LinkProfile
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.device_mapping import DeviceMappingRefiner, greedy_node_chain, node_order_map
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.runner import run_search
from planner.search_engine.strategy import Candidate

MODEL, UNIFORM = load_model("tiny-gpt"), load_cluster("dgx-a100-80g:4")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128, grad_reduce_dtype=DType.BF16)  # summed in bf16
FAST_BYTES_PER_S, SLOW_BYTES_PER_S = 25e9, 1e9
BANDWIDTH = tuple(
    tuple(0.0 if i == j else (SLOW_BYTES_PER_S if {i, j} == {0, 1} else FAST_BYTES_PER_S) for j in range(4))
    for i in range(4)
)
LINKS = LinkMatrix(size=4, bandwidth_bytes_per_s=BANDWIDTH, latency_s=tuple((5e-6,) * 4 for _ in range(4)))
SLOW_LINK = UNIFORM.model_copy(update={"inter_node_links": LINKS})


def test_greedy_chain_steps_over_the_fastest_link() -> None:
    # From node 0 the slow link to 1 is last choice: 2 (fastest, lowest), then 1, then 3.
    assert greedy_node_chain(LINKS, 0) == (0, 2, 1, 3)
    assert node_order_map((1, 0), 2).devices == (2, 3, 0, 1)
    assert node_order_map((0, 1), 2).is_identity


def _chain_link_by_link(links: LinkMatrix, start: int) -> tuple[int, ...]:
    """The chain as the first refiner walked it: the least (-bandwidth, latency, node) of each
    unvisited node's link from the last, read through ``LinkMatrix.link``."""
    order, left = [start], set(range(links.size)) - {start}
    while left:
        last = order[-1]
        step = min(left, key=lambda n: (-links.link(last, n).bandwidth_bytes_per_s, links.link(last, n).latency_s, n))
        order.append(step)
        left.remove(step)
    return tuple(order)


# Few distinct values, so that ties in bandwidth, then in latency, are common.
BANDWIDTHS, LATENCIES = st.sampled_from([1e9, 5e9, 25e9]), st.sampled_from([1e-6, 5e-6])


@st.composite
def node_matrices(draw: st.DrawFn) -> LinkMatrix:
    n = draw(st.integers(2, 9))
    if draw(st.booleans()):
        ends = tuple(LinkProfile(bandwidth_bytes_per_s=draw(BANDWIDTHS), latency_s=draw(LATENCIES)) for _ in range(n))
        return LinkMatrix(size=n, endpoints=ends)
    bandwidth = tuple(tuple(0.0 if i == j else draw(BANDWIDTHS) for j in range(n)) for i in range(n))
    latency = tuple(tuple(draw(LATENCIES) for _ in range(n)) for _ in range(n))
    return LinkMatrix(size=n, bandwidth_bytes_per_s=bandwidth, latency_s=latency)


@given(links=node_matrices(), data=st.data())
def test_chain_over_the_arrays_walks_as_one_reading_link_by_link(links: LinkMatrix, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, links.size - 1))
    assert greedy_node_chain(links, start) == _chain_link_by_link(links, start)


def test_chain_breaks_ties_by_latency_then_by_the_lowest_node() -> None:
    # From 0: nodes 1, 2, 3 all at 25 GB/s; 2 and 3 at 1 us, 1 at 5 us -> 2 (lower than 3);
    # from 2: 1 and 3 at 25 GB/s and 1 us -> 1; then 3.
    bandwidth = np.full((4, 4), 25e9)
    latency = np.full((4, 4), 1e-6)
    latency[0, 1] = 5e-6
    links = LinkMatrix(size=4, bandwidth_bytes_per_s=tuple(map(tuple, bandwidth)), latency_s=tuple(map(tuple, latency)))
    assert greedy_node_chain(links, 0) == (0, 2, 1, 3)


def test_refiner_is_never_slower_and_matches_the_best_node_order() -> None:
    evaluate = Evaluator(MODEL, TRAINING, SLOW_LINK)
    outcome = run_search(MODEL, TRAINING, SLOW_LINK, ExhaustiveSearch(), SearchSettings(top_k=3, seed=0), refiners=())
    for candidate in outcome.ranked[:3]:
        refined = DeviceMappingRefiner().refine(candidate, evaluate, Budget(), seed=0)
        assert sorted(refined.layout.device_map.devices or range(32)) == list(range(32))
        assert refined.estimate.step_time_s <= candidate.estimate.step_time_s
        best_s = min(
            evaluate(replace(candidate.layout, device_map=node_order_map(order, 8))).step_time_s
            for order in permutations(range(4))
        )
        assert refined.estimate.step_time_s <= best_s * (1 + 1e-9)
    # The fastest layout (dp32: one ring over all nodes) pays the slow link under the identity
    # (ring 0-1-2-3-0) and not after mapping (ring 0-2-1-3-0 has only fast node links). tiny-gpt's
    # gradients are small: NCCL's per-protocol latencies, which no mapping changes, are a good part.
    top = outcome.ranked[0]
    mapped = DeviceMappingRefiner().refine(top, evaluate, Budget(), seed=0)
    assert top.layout.data_parallel_degree == 32
    assert mapped.estimate.time.data_parallel_comm_s < 0.65 * top.estimate.time.data_parallel_comm_s
    assert mapped.estimate.step_time_s < 0.9 * top.estimate.step_time_s


def test_uniform_links_are_skipped_without_evaluating() -> None:
    evaluate = Evaluator(MODEL, TRAINING, UNIFORM)
    candidate = run_search(
        MODEL, TRAINING, UNIFORM, ExhaustiveSearch(), SearchSettings(top_k=1, seed=0), refiners=()
    ).ranked[0]
    before = evaluate.evaluations
    assert DeviceMappingRefiner().refine(candidate, evaluate, Budget(), seed=0) is candidate
    assert evaluate.evaluations == before


def test_node_links_that_differ_within_their_noise_keep_the_node_order() -> None:
    # The slow pair is 25x slower: beyond a measured spread of 0.5, within one of 0.99, where
    # which pair is slower is noise and a map chosen by it gains nothing when run.
    for spread, mapped in ((0.5, True), (0.99, False)):
        noisy = LINKS.model_copy(update={"bandwidth_spread": tuple((spread,) * 4 for _ in range(4))})
        cluster = UNIFORM.model_copy(update={"inter_node_links": noisy})
        evaluate = Evaluator(MODEL, TRAINING, cluster)
        top = run_search(
            MODEL, TRAINING, cluster, ExhaustiveSearch(), SearchSettings(top_k=1, seed=0), refiners=()
        ).ranked[0]
        before = evaluate.evaluations
        refined = DeviceMappingRefiner().refine(top, evaluate, Budget(), seed=0)
        assert (refined is not top) == mapped
        assert (evaluate.evaluations > before) == mapped


def test_mapping_gain_line_states_both_step_times() -> None:
    from planner.views.tables import mapping_gain

    evaluate = Evaluator(MODEL, TRAINING, SLOW_LINK)
    top = run_search(
        MODEL, TRAINING, SLOW_LINK, ExhaustiveSearch(), SearchSettings(top_k=1, seed=0), refiners=()
    ).ranked[0]
    mapped = DeviceMappingRefiner().refine(top, evaluate, Budget(), seed=0)
    line = mapping_gain(mapped.estimate, top.estimate)
    gain = 1 - mapped.estimate.step_time_s / top.estimate.step_time_s
    assert f"{mapped.estimate.step_time_s:.4g} s against {top.estimate.step_time_s:.4g} s" in line
    assert f"{gain:+.1%} faster" in line and gain > 0.1


def test_a_cluster_of_1024_nodes_is_mapped_and_no_slower() -> None:
    # Seeded random node bandwidths (5-25 GB/s, symmetric): the identity's dp ring meets slower
    # links than the greedy chains' rings, so a map is found; before, beyond 256 nodes was skipped.
    nodes = 1024
    rng = np.random.default_rng(0)
    bandwidth = rng.uniform(5e9, 25e9, (nodes, nodes))
    bandwidth = (bandwidth + bandwidth.T) / 2
    links = LinkMatrix(
        size=nodes,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple((5e-6,) * nodes for _ in range(nodes)),
    )
    cluster = load_cluster(f"dgx-a100-80g:{nodes}").model_copy(update={"inter_node_links": links})
    training = TrainingSpec(global_batch_size=nodes * 8, seq_len=128)
    evaluate = Evaluator(MODEL, training, cluster)
    layout = Layout(
        data_parallel_degree=nodes * 8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1
    )
    candidate = Candidate(layout, evaluate(layout))
    mapped = DeviceMappingRefiner().refine(candidate, evaluate, Budget(), seed=0)
    assert not mapped.layout.device_map.is_identity
    assert mapped.estimate.step_time_s < candidate.estimate.step_time_s
