"""Keeping each expert-parallel group inside a node is no rule of the search space (it offers
every ep that divides dp and the experts): it comes out of the cost model, which prices an
all-to-all across nodes higher than one over NVLink. On the same cluster with inter-node links
as fast as the intra-node ones, the search spreads expert parallelism over both nodes (among
layouts that split every expert over the tensor-parallel group: with the experts folded over a
stage's dp x tp ranks an ep 8 group fits one node at tp 2, and the search keeps it there on both
clusters). Selective recompute re-runs the attention core alone here: the cheaper recompute of
the MoE modules lets a micro-batch of 1 fit at pp 2 without context parallelism, whose ep 8 group
then spans both nodes and is still faster, which is not what this test looks at."""

from cost_models import groups as grp
from planner import api
from planner.files.clusters import load_cluster
from planner.schemas import ClusterProfile, Layout, Recompute, TrainingSpec
from planner.schemas.choices import RecomputeChoice
from planner.schemas.settings import SearchSettings

MODEL = "mixtral-8x7b"
CORE_ONLY = [RecomputeChoice(mode) for mode in Recompute]
TRAINING = TrainingSpec(global_batch_size=32, seq_len=4096)


def _best(cluster: ClusterProfile) -> tuple[Layout, Layout]:
    """The best layout whose experts are folded over a stage's ranks, and the best whose experts
    are split over the tensor-parallel group."""
    plans = api.search(MODEL, cluster, TRAINING, SearchSettings(top_k=60, constraints={"recompute": CORE_ONLY}))
    folded = next(p.layout for p in plans if p.layout.folds_experts)
    return folded, next(p.layout for p in plans if not p.layout.folds_experts)


def _nodes_per_expert_group(layout: Layout, devices_per_node: int) -> set[int]:
    """How many nodes each expert-parallel group spans."""
    return {len({d // devices_per_node for d in g.devices}) for g in grp.expert_groups(layout)}


def test_expert_parallel_groups_stay_in_a_node_because_crossing_nodes_is_priced_higher() -> None:
    cluster = load_cluster("dgx-h100:2")  # 2 nodes of 8 H100s: NVLink inside, InfiniBand between
    folded, split = _best(cluster)
    assert folded.expert_parallel_degree > 1 and split.expert_parallel_degree > 1
    assert _nodes_per_expert_group(folded, cluster.devices_per_node) == {1}
    assert _nodes_per_expert_group(split, cluster.devices_per_node) == {1}

    nvlink_everywhere = cluster.model_copy(
        update={
            "inter_node_links": cluster.inter_node_links.model_copy(
                update={"uniform": cluster.intra_node_links.uniform}
            )
        }
    )
    folded, wide = _best(nvlink_everywhere)
    assert _nodes_per_expert_group(folded, cluster.devices_per_node) == {1}
    assert _nodes_per_expert_group(wide, cluster.devices_per_node) == {2}
