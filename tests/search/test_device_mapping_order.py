"""The node-order mapping refiner: never slower than the candidate, as fast as the best of every
node order on a cluster with one slow node link, and no evaluation at all on uniform links."""

from dataclasses import replace
from itertools import permutations

from planner.inputs import load_cluster, load_model
from planner.schemas import LinkMatrix, TrainingSpec
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.device_mapping import DeviceMappingRefiner, greedy_node_chain, node_order_map
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.runner import run_search
from planner.search_engine.strategy import Budget

MODEL, UNIFORM = load_model("tiny-gpt"), load_cluster("dgx-a100-80g:4")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)
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


def test_refiner_is_never_slower_and_matches_the_best_node_order() -> None:
    evaluate = Evaluator(MODEL, TRAINING, SLOW_LINK)
    outcome = run_search(MODEL, TRAINING, SLOW_LINK, ExhaustiveSearch(), top_k=3, seed=0, refiners=())
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
    # (ring 0-1-2-3-0) and not after mapping (ring 0-2-1-3-0 has only fast node links).
    top = outcome.ranked[0]
    mapped = DeviceMappingRefiner().refine(top, evaluate, Budget(), seed=0)
    assert top.layout.data_parallel_degree == 32
    assert mapped.estimate.time.data_parallel_comm_s < 0.5 * top.estimate.time.data_parallel_comm_s
    assert mapped.estimate.step_time_s < 0.9 * top.estimate.step_time_s


def test_uniform_links_are_skipped_without_evaluating() -> None:
    evaluate = Evaluator(MODEL, TRAINING, UNIFORM)
    candidate = run_search(MODEL, TRAINING, UNIFORM, ExhaustiveSearch(), top_k=1, seed=0, refiners=()).ranked[0]
    before = evaluate.evaluations
    assert DeviceMappingRefiner().refine(candidate, evaluate, Budget(), seed=0) is candidate
    assert evaluate.evaluations == before


def test_mapping_gain_line_states_both_step_times() -> None:
    from planner.render import mapping_gain

    evaluate = Evaluator(MODEL, TRAINING, SLOW_LINK)
    top = run_search(MODEL, TRAINING, SLOW_LINK, ExhaustiveSearch(), top_k=1, seed=0, refiners=()).ranked[0]
    mapped = DeviceMappingRefiner().refine(top, evaluate, Budget(), seed=0)
    line = mapping_gain(mapped.estimate, top.estimate)
    gain = 1 - mapped.estimate.step_time_s / top.estimate.step_time_s
    assert f"{mapped.estimate.step_time_s:.4g} s against {top.estimate.step_time_s:.4g} s" in line
    assert f"{gain:+.1%} faster" in line and gain > 0.1
