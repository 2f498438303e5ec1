"""The deduplicating token dispatcher (DeepEP): a token crosses to each remote node once."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models import groups as grp
from cost_models.comm import Group, collective_time_s
from cost_models.estimate import estimate
from cost_models.expert_parallel import off_node_share
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import CollectiveOp, Layout, MoeDispatcher, TrainingSpec


def test_deepseek_s_node_limited_routing_halves_what_crosses_over_8_nodes() -> None:
    # 8 groups of 32 experts, 4 per token, one group per node: a node is untouched with
    # chance C(7, 4) / C(8, 4) = 1/2, so 7 x 1/2 = 3.5 remote nodes against 8 x 7/8 = 7 pairs.
    assert off_node_share(load_model("deepseek-v3"), 8) == pytest.approx(0.5)
    # over 4 nodes (2 groups each): 1 - C(6, 4) / C(8, 4) = 55/70 of 3 nodes, against 6 pairs
    assert off_node_share(load_model("deepseek-v3"), 4) == pytest.approx(3 * 55 / 70 / 6)


def test_without_groups_a_token_s_experts_are_a_uniform_subset() -> None:
    # Mixtral, 8 experts, 2 per token, over 2 nodes of 4 experts: the remote node is untouched
    # with chance C(4, 2) / C(8, 2) = 6/28; 22/28 crossing against 2 x 1/2 = 1 pair.
    assert off_node_share(load_model("mixtral-8x7b"), 2) == pytest.approx(22 / 28)
    assert off_node_share(load_model("mixtral-8x7b"), 1) == 1.0


def test_an_all_to_all_across_nodes_sends_its_share_off_node() -> None:
    # 2 nodes of 4, 100 GB/s inside, 10 GB/s across, 1 us: the 8 ranks send 4/8 of 80 MB
    # off-node (4 ms at full share) and 3/8 on-node (0.3 ms); one inter-node latency.
    cluster = make_cluster(nodes=2, per_node=4)
    group = Group(range(8))
    full = collective_time_s(CollectiveOp.ALL_TO_ALL, 80e6, group, cluster)
    half = collective_time_s(CollectiveOp.ALL_TO_ALL, 80e6, group, cluster, off_node_share=0.5)
    assert full == pytest.approx(1e-6 + 4e-3)
    assert half == pytest.approx(1e-6 + 2e-3)
    # inside one node there is nothing off-node to share
    one = Group(range(4))
    assert collective_time_s(CollectiveOp.ALL_TO_ALL, 80e6, one, cluster, off_node_share=0.5) == collective_time_s(
        CollectiveOp.ALL_TO_ALL, 80e6, one, cluster
    )


def test_the_estimate_prices_the_dispatcher_the_training_names() -> None:
    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100:32")
    plain = TrainingSpec(global_batch_size=512, seq_len=4096)
    deepep = plain.model_copy(update={"moe_dispatcher": MoeDispatcher.DEEPEP})
    across = Layout(
        data_parallel_degree=64,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=4,
        expert_parallel_degree=64,
        micro_batch_size=1,
        zero_stage=3,
        recompute="full",
    )
    assert {len({d // 8 for d in g.devices}) for g in grp.expert_groups(across)} == {8}
    a2a = [estimate(model, t, cluster, across).time.expert_parallel_comm_s for t in (plain, deepep)]
    assert a2a[1] < 0.6 * a2a[0]
    inside = replace(across, expert_parallel_degree=8)
    assert estimate(model, deepep, cluster, inside).time == estimate(model, plain, cluster, inside).time
