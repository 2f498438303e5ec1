"""A layout's expert placement beside round-robin (cost_models.placement_comparison), hand-worked on
a trace whose every token goes to experts 0 and 1 of tiny-moe (4 MoE layers of 4 experts, top-2)."""

import numpy as np
import pytest

from cost_models.placement_comparison import compare_placements, expert_group_nodes
from planner.files.models import load_model
from planner.files.routing_trace import summarize
from planner.schemas import DeviceMap, ExpertPlacement, Layout
from planner.schemas.errors import SchemaError

MOE = load_model("tiny-moe")
TOKENS = 10
STATS = summarize(np.tile(np.array([0, 1]), (TOKENS, 4, 1)), 4, "tiny-moe")


def _layout(dp: int = 4, tp: int = 1, ep: int = 2, devices: tuple[int, ...] = (), **kw: object) -> Layout:
    return Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=ep,
        device_map=DeviceMap(devices=devices),
        **kw,  # type: ignore[arg-type]
    )


def test_group_nodes_follow_the_expert_groups_and_the_device_map() -> None:
    # ep groups are runs of ep consecutive replicas, strided by tp: with tp 2 the groups are ranks
    # (0, 2) and (1, 3), each across both nodes of 2 devices.
    assert expert_group_nodes(_layout(dp=2, tp=2), devices_per_node=2) == ((0, 1), (0, 1))
    # Groups (0, 1), (2, 3), (4, 5) on devices (0, 1), (2, 4), (3, 5): one node, then two and two.
    mapped = _layout(dp=6, devices=(0, 1, 2, 4, 3, 5))
    assert expert_group_nodes(mapped, devices_per_node=2) == ((0, 0), (0, 1), (0, 1))


def test_contiguous_beside_round_robin_is_the_hand_worked_count() -> None:
    # Contiguous: rank 0 hosts experts {0, 1}, rank 1 {2, 3}. Each layer sends all 2 x 10 routed
    # tokens to rank 0 (hottest 20, mean 10; 4 layers: 80 and 40) and no pair crosses ranks.
    # Round-robin: rank 0 {0, 2}, rank 1 {1, 3}: 10 and 10 per layer (40 and 40), and of each
    # token's 4 pairs between consecutive layers, (0, 1) and (1, 0) cross: 2 x 10 x 3 = 60.
    got = compare_placements(STATS, MOE, _layout(), devices_per_node=2)
    assert got is not None and got.contiguous and got.groups == 2 and got.nodes_per_group == 1
    assert got.placed.hottest_rank_tokens == 80 and got.placed.mean_rank_tokens == 40
    assert got.placed.cross_rank_tokens == 0 and got.placed.cross_node_tokens == 0
    assert got.round_robin.hottest_rank_tokens == 40 and got.round_robin.mean_rank_tokens == 40
    assert got.round_robin.cross_rank_tokens == pytest.approx(60)
    assert got.round_robin.cross_node_tokens == 0  # both ranks of each group on one node
    # Ranks 0 and 1 on devices 0 and 2: each group spans both nodes, and what crosses ranks crosses nodes.
    spread = compare_placements(STATS, MOE, _layout(devices=(0, 2, 1, 3)), devices_per_node=2)
    assert spread is not None and spread.nodes_per_group == 2
    assert spread.round_robin.cross_node_tokens == pytest.approx(60) and spread.placed.cross_node_tokens == 0


def test_the_busiest_group_is_reported() -> None:
    # One group within a node, two across nodes: the cross-node tokens are those of the latter.
    got = compare_placements(STATS, MOE, _layout(dp=6, devices=(0, 1, 2, 4, 3, 5)), devices_per_node=2)
    assert got is not None and got.round_robin.cross_node_tokens == pytest.approx(60)


def test_a_placement_with_replicas_splits_the_hot_experts_tokens() -> None:
    # Experts 0 and 1 on both ranks: each rank gets half their tokens, 10 per layer (40), and a
    # pair stays on one rank half the time (1/2 x 1/2 on each of 2 ranks): 4 pairs x 10 x 1/2 x 3 = 60.
    replicated = ExpertPlacement(slots=(((0, 1, 2), (0, 1, 3)),) * 4)
    got = compare_placements(STATS, MOE, _layout(expert_placement=replicated), devices_per_node=2)
    assert got is not None and not got.contiguous
    assert got.placed.hottest_rank_tokens == pytest.approx(40) and got.placed.cross_rank_tokens == pytest.approx(60)


def test_nothing_to_compare_without_expert_parallelism_and_a_trace_of_another_model_is_refused() -> None:
    assert compare_placements(STATS, MOE, _layout(ep=1), devices_per_node=2) is None
    other = summarize(np.tile(np.array([0, 1]), (TOKENS, 3, 1)), 4, "other")
    with pytest.raises(SchemaError, match="3 MoE layers of 4 experts, but 'tiny-moe' has 4 of 4"):
        compare_placements(other, MOE, _layout(), devices_per_node=2)
