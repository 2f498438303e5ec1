"""``planner.survivors``: a cluster cut to the ranks an elastic restart has left."""

import pytest
from conftest import make_cluster

from planner.flows.replan import first_endpoints, survivors
from planner.schemas import CollectiveOp, CollectiveRecord, LinkMatrix, LinkProfile, NodeOverride, Placement
from planner.schemas.errors import InfeasibleConfigError


def _record(group_size: int) -> CollectiveRecord:
    return CollectiveRecord(
        op=CollectiveOp.ALL_REDUCE,
        placement=Placement.INTRA_NODE,
        group_size=group_size,
        members_per_node=group_size,
        message_bytes=1024,
        time_s=1e-4 * group_size,
    )


def test_one_node_keeps_its_first_devices_their_measured_links_and_the_curves_that_fit() -> None:
    bandwidth = tuple(tuple(float(10 * i + j + 1) for j in range(4)) for i in range(4))
    links = LinkMatrix(size=4, bandwidth_bytes_per_s=bandwidth, latency_s=tuple((1e-6,) * 4 for _ in range(4)))
    cluster = make_cluster(per_node=4).model_copy(
        update={"intra_node_links": links, "collectives": (_record(2), _record(3), _record(4))}
    )
    cut = survivors(cluster, 3)
    assert (cut.num_nodes, cut.devices_per_node, cut.world_size) == (1, 3, 3)
    assert cut.intra_node_links.bandwidth_bytes_per_s == ((1.0, 2.0, 3.0), (11.0, 12.0, 13.0), (21.0, 22.0, 23.0))
    assert [c.group_size for c in cut.collectives] == [2, 3]
    assert cut.name == "test-first-3"
    assert cut.device == cluster.device
    assert survivors(cluster, 4) is cluster


def test_several_nodes_lose_whole_nodes_with_their_overrides() -> None:
    cluster = make_cluster(nodes=4, per_node=2)
    rails = tuple(LinkProfile(bandwidth_bytes_per_s=b, latency_s=1e-6) for b in (1e9, 2e9, 3e9, 4e9))
    fast = LinkMatrix(size=2, uniform=LinkProfile(bandwidth_bytes_per_s=1e12, latency_s=0.0))
    cluster = cluster.model_copy(
        update={
            "inter_node_links": LinkMatrix(size=4, endpoints=rails),
            "node_overrides": (NodeOverride(nodes=(1, 3), intra_node_links=fast),),
        }
    )
    cut = survivors(cluster, 4)
    assert (cut.num_nodes, cut.devices_per_node) == (2, 2)
    assert cut.inter_node_links.endpoints == rails[:2]
    assert cut.node_overrides[0].nodes == (1,)
    assert cut.node_links(1) == fast and cut.node_links(0) == cluster.intra_node_links
    assert survivors(cluster, 2).node_overrides == ()


@pytest.mark.parametrize(("world", "says"), [(5, "not whole nodes"), (9, "do not fit"), (0, "do not fit")])
def test_a_world_the_cluster_cannot_hold_is_refused_naming_it(world: int, says: str) -> None:
    with pytest.raises(InfeasibleConfigError, match=says):
        survivors(make_cluster(nodes=4, per_node=2), world)


def test_a_uniform_matrix_only_shrinks() -> None:
    uniform = LinkProfile(bandwidth_bytes_per_s=5e9, latency_s=2e-6)
    assert first_endpoints(LinkMatrix(size=8, uniform=uniform), 3) == LinkMatrix(size=3, uniform=uniform)
