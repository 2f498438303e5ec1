"""Collective and point-to-point pricing over a group's links, against hand-worked values."""

from datetime import datetime

import pytest
from conftest import make_cluster

from cost_models.comm import Group, collective_time_s, p2p_time_s
from planner.schemas import ClusterProfile, CollectiveOp, CollectiveRecord, LinkMatrix, Placement


def test_volume_factors_follow_nccl_tests() -> None:
    assert CollectiveOp.ALL_REDUCE.volume_factor(4) == pytest.approx(1.5)
    assert CollectiveOp.ALL_GATHER.volume_factor(4) == pytest.approx(0.75)
    assert CollectiveOp.ALL_REDUCE.volume_factor(1) == 0.0


def test_intra_node_ring_is_latency_plus_volume_over_bandwidth() -> None:
    cluster = make_cluster(intra_bw=100e9, latency_s=1e-6)
    t = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 1, 2, 3)), cluster)
    assert t == pytest.approx(6 * 1e-6 + 1.5 * 1e9 / 100e9)


def test_single_rank_group_is_free() -> None:
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((3,)), make_cluster()) == 0.0


def test_a_group_spanning_nodes_runs_one_ring_over_each_nodes_rails() -> None:
    cluster = make_cluster(nodes=2, per_node=4, intra_bw=100e9, inter_bw=10e9, latency_s=0.0)
    full_nodes = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group(tuple(range(8))), cluster)
    # One ring through the 8 members in NCCL's Simple protocol: 2 (8-1)/8 of 1 GB per rank,
    # carried by each node's 4 rails at once (40 GB/s, below 100 GB/s inside); a tree would move
    # 2 GB at 0.92 x 40 GB/s. Its latency, NCCL's (the links' is 0, below NCCL's own): base 8.4 us,
    # 12 NVLink hops of 3.4 us and 2 network hops of 14 us, x 1.4 (the ring's "plateau").
    ring_latency_s = 1.4 * (8.4e-6 + 12 * 3.4e-6 + 2 * 14e-6)
    assert full_nodes == pytest.approx(ring_latency_s + 1.75e9 / 40e9)
    one_per_node = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 4)), cluster)
    assert one_per_node == pytest.approx(1.4 * (8.4e-6 + 2 * 14e-6) + 1e9 / 10e9)
    assert one_per_node > full_nodes


def test_slowest_link_of_an_explicit_ring_bounds_it() -> None:
    bw = [[1e12 if i == j else 100e9 for j in range(4)] for i in range(4)]
    bw[2][3] = bw[3][2] = 10e9
    lat = [[0.0] * 4 for _ in range(4)]
    base = make_cluster(per_node=4)
    cluster = base.model_copy(update={"intra_node_links": LinkMatrix(size=4, bandwidth_bytes_per_s=bw, latency_s=lat)})
    fast = collective_time_s(CollectiveOp.ALL_GATHER, 1e9, Group((0, 1)), cluster)
    slow = collective_time_s(CollectiveOp.ALL_GATHER, 1e9, Group((2, 3)), cluster)
    assert fast == pytest.approx(0.5 * 1e9 / 100e9)
    assert slow == pytest.approx(0.5 * 1e9 / 10e9)
    assert p2p_time_s(1e9, 3, 2, cluster) == pytest.approx(0.1)


def test_measured_curve_is_interpolated_log_log_in_bus_bandwidth() -> None:
    def rec(size: int, busbw: float) -> CollectiveRecord:
        return CollectiveRecord(
            op=CollectiveOp.ALL_REDUCE,
            placement=Placement.INTRA_NODE,
            group_size=8,
            members_per_node=8,
            message_bytes=size,
            time_s=size * 1.75 / busbw,
        )

    cluster: ClusterProfile = make_cluster().model_copy(update={"collectives": (rec(2**20, 10e9), rec(2**30, 1000e9))})
    group = Group(tuple(range(8)))
    # Halfway in log size between the records is halfway in log bandwidth: 100 GB/s.
    mid = 2**25
    assert collective_time_s(CollectiveOp.ALL_REDUCE, mid, group, cluster) == pytest.approx(mid * 1.75 / 100e9)
    # Beyond the records the nearest bandwidth holds; other ops reuse the all-reduce curve.
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 2**32, group, cluster) == pytest.approx(2**32 * 1.75 / 1000e9)
    assert collective_time_s(CollectiveOp.ALL_GATHER, 2**30, group, cluster) == pytest.approx(2**30 * 0.875 / 1000e9)
    assert isinstance(cluster.provenance.created, datetime)


def _slow_pair_hosts(ring_bandwidth_bytes_per_s: float | None) -> ClusterProfile:
    """3 nodes of 1 device; the link between nodes 0 and 1 at 1 GB/s, the others at 10 GB/s; one
    measured all-reduce over all 3 (ring 0-1-2) at 1 GB of bus bandwidth per second."""
    bw = [[1e12 if i == j else 10e9 for j in range(3)] for i in range(3)]
    bw[0][1] = bw[1][0] = 1e9
    record = CollectiveRecord(
        op=CollectiveOp.ALL_REDUCE,
        placement=Placement.INTER_NODE,
        group_size=3,
        members_per_node=1,
        message_bytes=10**9,
        time_s=(4 / 3) * 1e9 / 1e9,
        ring_bandwidth_bytes_per_s=ring_bandwidth_bytes_per_s,
    )
    base = make_cluster(nodes=3, per_node=1)
    links = LinkMatrix(size=3, bandwidth_bytes_per_s=bw, latency_s=[[0.0] * 3 for _ in range(3)])
    return base.model_copy(update={"inter_node_links": links, "collectives": (record,)})


def test_a_record_says_which_links_it_ran_over_and_each_group_is_priced_over_its_own() -> None:
    measured = _slow_pair_hosts(ring_bandwidth_bytes_per_s=1e9)
    # A 2-member all-reduce moves 1x its buffer per rank; at the record's 1 GB/s of bus bandwidth
    # that is 1 s over the slow pair, and 10x faster over a pair whose link is 10x faster.
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 1)), measured) == pytest.approx(1.0)
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((1, 2)), measured) == pytest.approx(0.1)
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((2, 0)), measured) == pytest.approx(0.1)
    # A record that does not say (presets, older profiles) stands for every group.
    unsaid = _slow_pair_hosts(ring_bandwidth_bytes_per_s=None)
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((1, 2)), unsaid) == pytest.approx(1.0)


def test_a_two_member_ring_runs_at_its_pairs_duplex_bandwidth() -> None:
    # The test hosts' case (benchmarks/netns_profile.py): the slow pair gets 0.8 of its one-way
    # 1 GB/s when both ends send at once, as a 2-member all-reduce's ring does; the 3-member ring
    # the record was measured on sends one way over each link, so its curve is one-way.
    measured = _slow_pair_hosts(ring_bandwidth_bytes_per_s=1e9)
    duplex = [[0.0 if i == j else 10e9 for j in range(3)] for i in range(3)]
    duplex[0][1] = duplex[1][0] = 0.8e9
    links = measured.inter_node_links.model_copy(update={"duplex_bandwidth_bytes_per_s": duplex})
    halved = measured.model_copy(update={"inter_node_links": links})
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 1)), halved) == pytest.approx(1.25)
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((1, 2)), halved) == pytest.approx(0.1)
    # A ring of three sends one way over each link: as before; so does a send.
    assert collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 1, 2)), halved) == pytest.approx(4 / 3)
    assert p2p_time_s(1e9, 0, 1, halved) == pytest.approx(1.0)


def _two_by_two(op: CollectiveOp, time_s: float) -> ClusterProfile:
    """2 nodes x 2 devices whose profile measured ``op`` over all 4 (the profiler's world shape):
    1 MB in ``time_s``."""
    record = CollectiveRecord(
        op=op, placement=Placement.INTER_NODE, group_size=4, members_per_node=2, message_bytes=10**6, time_s=time_s
    )
    base = make_cluster(nodes=2, per_node=2, intra_bw=100e9, inter_bw=10e9, latency_s=0.0)
    return base.model_copy(update={"collectives": (record,)})


def test_a_group_measured_whole_is_priced_from_its_own_records() -> None:
    # All-gather over the 4 ranks in 0.75 s: 3/4 of 1 MB moved, bus bandwidth 1 MB/s; 2 MB take 1.5 s
    # (the nearest measured bandwidth). The hierarchical model would give about 0.5 s: an
    # all-gather of 1 MB per rail over 2 nodes on the same curve, 1/2 of it moved.
    cluster = _two_by_two(CollectiveOp.ALL_GATHER, 0.75)
    assert collective_time_s(CollectiveOp.ALL_GATHER, 2e6, Group((0, 1, 2, 3)), cluster) == pytest.approx(1.5)
    assert collective_time_s(CollectiveOp.ALL_GATHER, 2e6, Group(range(4)), cluster) == pytest.approx(1.5)
    # A ring that crosses between the nodes 4 times is not the measured group: hierarchical,
    # inside each node 1/2 of 2 MB at 100 GB/s, then 1/2 of 1 MB per rail at 1 MB/s.
    crossing = collective_time_s(CollectiveOp.ALL_GATHER, 2e6, Group((0, 2, 1, 3)), cluster)
    assert crossing == pytest.approx(0.5 * 2e6 / 100e9 + 0.5)
    # One rank per node is another shape: the 2-node curve of the nearest records, 1/2 of 2 MB.
    assert collective_time_s(CollectiveOp.ALL_GATHER, 2e6, Group((0, 2)), cluster) == pytest.approx(1.0)
    # All-to-all keeps its link pricing: half the buffer off the node at 10 GB/s.
    assert collective_time_s(CollectiveOp.ALL_TO_ALL, 2e6, Group((0, 1, 2, 3)), cluster) == pytest.approx(1e-4)


def test_the_whole_groups_all_reduce_stands_in_for_its_other_ops() -> None:
    # All-reduce of 1 MB in 1.5 s: 2 x 3/4 of it moved, bus bandwidth 1 MB/s; a reduce-scatter
    # of 2 MB moves 3/4 of it at that bandwidth.
    cluster = _two_by_two(CollectiveOp.ALL_REDUCE, 1.5)
    assert collective_time_s(CollectiveOp.REDUCE_SCATTER, 2e6, Group((0, 1, 2, 3)), cluster) == pytest.approx(1.5)
