"""Keeping each expert-parallel group inside a node is no rule of the search space (it offers
every ep that divides dp and the experts): it comes out of the cost model, which prices an
all-to-all across nodes higher than one over NVLink. On the same cluster with inter-node links
as fast as the intra-node ones, the search spreads expert parallelism over both nodes."""

from cost_models import groups as grp
from planner import api
from planner.inputs import load_cluster
from planner.schemas import ClusterProfile, Layout, TrainingSpec

MODEL = "mixtral-8x7b"
TRAINING = TrainingSpec(global_batch_size=32, seq_len=4096)


def _best(cluster: ClusterProfile) -> Layout:
    (plan,) = api.search(MODEL, cluster, TRAINING, top_k=1)
    return plan.layout


def _nodes_per_expert_group(layout: Layout, devices_per_node: int) -> set[int]:
    """How many nodes each expert-parallel group spans."""
    return {len({d // devices_per_node for d in g.devices}) for g in grp.expert_groups(layout)}


def test_expert_parallel_groups_stay_in_a_node_because_crossing_nodes_is_priced_higher() -> None:
    cluster = load_cluster("dgx-h100:2")  # 2 nodes of 8 H100s: NVLink inside, InfiniBand between
    best = _best(cluster)
    assert best.expert_parallel_degree > 1
    assert _nodes_per_expert_group(best, cluster.devices_per_node) == {1}

    nvlink_everywhere = cluster.model_copy(
        update={
            "inter_node_links": cluster.inter_node_links.model_copy(
                update={"uniform": cluster.intra_node_links.uniform}
            )
        }
    )
    wide = _best(nvlink_everywhere)
    assert _nodes_per_expert_group(wide, cluster.devices_per_node) == {2}
