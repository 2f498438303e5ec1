"""Links read per node: a ring inside a slow node is slower, a group spanning nodes waits for
the slowest node's inside phase, and a cluster described node by node but alike prices exactly
as one matrix shared by every node (what a version-3 profile holds)."""

from dataclasses import replace

import pytest
from conftest import make_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.comm import (
    Group,
    collective_time_s,
    device_link,
    has_uniform_links,
    p2p_time_s,
    priced_groups,
    slowest_collective_s,
)
from cost_models.estimate import estimate
from planner.files.models import load_model
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    DType,
    Layout,
    LinkMatrix,
    LinkProfile,
    NicKind,
    NodeOverride,
    TrainingSpec,
)


def _with(cluster: ClusterProfile, *overrides: NodeOverride, **fields: object) -> ClusterProfile:
    """``cluster`` with node overrides (validated as a file would be)."""
    return ClusterProfile.model_validate({**dict(cluster), "node_overrides": overrides, **fields})


def _slow_node_1() -> ClusterProfile:
    """2 nodes x 4 devices: 100 GB/s inside node 0, 50 GB/s inside node 1, 10 GB/s rails, no latency."""
    base = make_cluster(nodes=2, per_node=4, intra_bw=100e9, inter_bw=10e9, latency_s=0.0)
    slow = LinkMatrix(size=4, uniform=LinkProfile(bandwidth_bytes_per_s=50e9, latency_s=0.0))
    return _with(base, NodeOverride(nodes=(1,), intra_node_links=slow))


def test_a_ring_in_a_slow_node_is_slower() -> None:
    cluster = _slow_node_1()
    # Ring all-reduce of 1 GB over 4 members: 2 (4-1)/4 = 1.5 GB per rank.
    fast = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group(range(0, 4)), cluster)
    slow = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group(range(4, 8)), cluster)
    assert fast == pytest.approx(1.5e9 / 100e9)
    assert slow == pytest.approx(1.5e9 / 50e9)


def test_a_group_spanning_nodes_waits_for_the_slowest_node() -> None:
    cluster = _slow_node_1()
    t = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group(range(8)), cluster)
    # One ring through both nodes, 2 (8-1)/8 of 1 GB per rank, no faster than a ring inside the
    # slower node (50 GB/s) nor than the 4 rails of a node at once (40 GB/s): the rails decide.
    # Its latency is NCCL's Simple ring's: base, 12 NVLink hops, 2 network hops, x 1.4 (plateau).
    ring_latency_s = 1.4 * (8.4e-6 + 12 * 3.4e-6 + 2 * 14e-6)
    assert t == pytest.approx(ring_latency_s + 1.75e9 / 40e9)
    slower = LinkMatrix(size=4, uniform=LinkProfile(bandwidth_bytes_per_s=20e9, latency_s=0.0))
    base = make_cluster(nodes=2, per_node=4, intra_bw=100e9, inter_bw=10e9, latency_s=0.0)
    slow_inside = _with(base, NodeOverride(nodes=(1,), intra_node_links=slower))
    # At 20 GB/s inside node 1, node 1 decides.
    slow_s = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group(range(8)), slow_inside)
    assert slow_s == pytest.approx(ring_latency_s + 1.75e9 / 20e9)
    # All-to-all: (4-1)/8 of 1 GB on-node at the slower node's 50 GB/s, 4/8 off-node at 10 GB/s.
    a2a = collective_time_s(CollectiveOp.ALL_TO_ALL, 1e9, Group(range(8)), cluster)
    assert a2a == pytest.approx(max(0.5e9 / 10e9, 3 / 8 * 1e9 / 50e9))


def test_a_send_inside_a_node_uses_that_nodes_link() -> None:
    cluster = _slow_node_1()
    assert device_link(cluster, 4, 5).bandwidth_bytes_per_s == 50e9
    assert device_link(cluster, 0, 1).bandwidth_bytes_per_s == 100e9
    assert device_link(cluster, 1, 5).bandwidth_bytes_per_s == 10e9
    assert p2p_time_s(1e9, 4, 5, cluster) == pytest.approx(1e9 / 50e9)
    assert p2p_time_s(1e9, 0, 1, cluster) == pytest.approx(1e9 / 100e9)


def test_a_node_matrix_of_endpoints_runs_each_pair_at_its_slower_end() -> None:
    base = make_cluster(nodes=3, per_node=2, latency_s=0.0)
    rails = (10e9, 5e9, 10e9)
    endpoints = tuple(LinkProfile(bandwidth_bytes_per_s=bw, latency_s=1e-6 * (i + 1)) for i, bw in enumerate(rails))
    cluster = _with(base, inter_node_links=LinkMatrix(size=3, endpoints=endpoints))
    assert cluster.inter_node_links.link(0, 2) == LinkProfile(bandwidth_bytes_per_s=10e9, latency_s=3e-6)
    assert cluster.inter_node_links.link(0, 1) == LinkProfile(bandwidth_bytes_per_s=5e9, latency_s=2e-6)
    # One device per node on nodes 0 and 2 (devices 0, 4): a 2-member all-reduce, a ring in NCCL's
    # Simple protocol: 2 network hops of NCCL's 14 us plus twice (the flush) the 0.3 us by which
    # the link's 3 us exceeds NCCL's 2.7, x 1.4 with the base 8.4 us; 2 (2-1)/2 GB at 10 GB/s.
    # Through node 1 as well: 4 hops, and node 1's 5 GB/s.
    two = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 4)), cluster)
    three = collective_time_s(CollectiveOp.ALL_REDUCE, 1e9, Group((0, 2, 4)), cluster)
    hop_s = 14e-6 + 2 * 0.3e-6
    assert two == pytest.approx(1.4 * (8.4e-6 + 2 * hop_s) + 1e9 / 10e9)
    assert three == pytest.approx(1.4 * (8.4e-6 + 4 * hop_s) + 4 / 3 * 1e9 / 5e9)
    assert not has_uniform_links(cluster)


def test_uniform_links_only_when_every_node_has_the_same() -> None:
    base = make_cluster(nodes=2, per_node=4)
    assert has_uniform_links(base)
    assert not has_uniform_links(_slow_node_1())
    # Another interface type or device changes no link: the one-group fast path stays.
    assert has_uniform_links(_with(base, NodeOverride(nodes=(1,), nic=NicKind.ROCE)))
    assert has_uniform_links(_with(base, NodeOverride(nodes=(1,), intra_node_links=base.intra_node_links)))


def test_a_stage_spanning_mixed_devices_is_priced_as_the_slowest_with_the_smallest_memory() -> None:
    slow = make_cluster(nodes=2, per_node=4, memory_bytes=80 * 2**30)
    fast = slow.device.model_copy(
        update={
            "name": "fast-gpu",
            "memory_bytes": 40 * 2**30,
            "peak_flop_per_s": {DType.BF16: 300e12, DType.FP16: 300e12, DType.FP32: 30e12},
        }
    )
    mixed = _with(slow, NodeOverride(nodes=(1,), device=fast))
    assert mixed.has_mixed_devices and mixed.node_device(1).name == "fast-gpu"
    assert mixed.pricing_device.name == "test-gpu" and mixed.pricing_device.memory_bytes == 40 * 2**30
    # One stage on both nodes: every term reads the pricing device, so the mixed cluster prices as a
    # uniform one of it; only MFU and HFU divide by the ranks' own peaks (4 x 100 and 4 x 300 TFLOP/s).
    conservative = make_cluster(nodes=2, per_node=4, memory_bytes=40 * 2**30)
    model, training = load_model("tiny-gpt"), TrainingSpec(global_batch_size=16, seq_len=128, dtype=DType.BF16)
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=1)
    priced, uniform = estimate(model, training, mixed, layout), estimate(model, training, conservative, layout)
    assert replace(priced, mfu=uniform.mfu, hfu=uniform.hfu) == uniform
    assert priced.mfu == pytest.approx(uniform.mfu * 100 / 200)


_OPS = st.sampled_from([CollectiveOp.ALL_REDUCE, CollectiveOp.ALL_GATHER, CollectiveOp.ALL_TO_ALL])


@st.composite
def _matrix(draw: st.DrawFn, size: int) -> LinkMatrix:
    bw = st.floats(1e9, 1e12)
    lat = st.floats(0.0, 1e-5)
    return LinkMatrix(
        size=size,
        bandwidth_bytes_per_s=tuple(tuple(0.0 if i == j else draw(bw) for j in range(size)) for i in range(size)),
        latency_s=tuple(tuple(0.0 if i == j else draw(lat) for j in range(size)) for i in range(size)),
    )


@settings(max_examples=60, deadline=None)
@given(
    shared=_matrix(4),
    other=_matrix(4),
    op=_OPS,
    devices=st.lists(st.integers(0, 11), min_size=2, max_size=12, unique=True),
    message_bytes=st.floats(1.0, 1e10),
)
def test_nodes_described_alike_price_as_one_shared_matrix(
    shared: LinkMatrix, other: LinkMatrix, op: CollectiveOp, devices: list[int], message_bytes: float
) -> None:
    """Every node given ``shared`` by an override (the default is another matrix) prices each
    collective and send exactly as ``shared`` as the one matrix of every node (version 3)."""
    base = make_cluster(nodes=3, per_node=4)
    single = _with(base, intra_node_links=shared)
    per_node = _with(base, NodeOverride(nodes=(0, 1, 2), intra_node_links=shared), intra_node_links=other)
    group = Group(tuple(devices))
    assert collective_time_s(op, message_bytes, group, per_node) == collective_time_s(op, message_bytes, group, single)
    a, b = devices[:2]
    assert p2p_time_s(message_bytes, a, b, per_node) == p2p_time_s(message_bytes, a, b, single)


@settings(max_examples=40, deadline=None)
@given(
    order=st.permutations(range(16)),
    size=st.sampled_from([2, 4, 8]),
    op=_OPS,
    rank_order=st.booleans(),
)
def test_one_group_per_spread_over_node_classes_prices_the_slowest(
    order: list[int], size: int, op: CollectiveOp, rank_order: bool
) -> None:
    """Deduplicating an axis's groups by the classes of the nodes they span (and their members'
    local indices) keeps the slowest group's time, on nodes of two kinds with per-node rails."""
    base = make_cluster(nodes=4, per_node=4, latency_s=1e-6)
    slow = LinkMatrix(size=4, uniform=LinkProfile(bandwidth_bytes_per_s=30e9, latency_s=2e-6))
    rails = tuple(LinkProfile(bandwidth_bytes_per_s=bw, latency_s=1e-6) for bw in (10e9, 10e9, 5e9, 5e9))
    cluster = _with(
        base, NodeOverride(nodes=(1, 3), intra_node_links=slow), inter_node_links=LinkMatrix(size=4, endpoints=rails)
    )
    devices = list(range(16)) if rank_order else order
    groups = [Group(tuple(devices[i : i + size])) for i in range(0, 16, size)]
    priced = priced_groups(groups, cluster, rank_order=rank_order)
    if rank_order:  # one group per node kind (links inside, rail) and members per node
        assert len(priced) == {2: 4, 4: 4, 8: 2}[size]
    assert slowest_collective_s(op, 1e8, priced, cluster) == slowest_collective_s(op, 1e8, groups, cluster)
