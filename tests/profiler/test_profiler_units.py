"""Pieces of the profiler that need no process group: rounds, statistics, link arithmetic, and
building a hierarchical profile from measurements."""

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from planner.schemas import (
    CollectiveOp,
    DeviceKind,
    DType,
    LayerRecord,
    NicKind,
    OpKind,
    PipelineSlotRecord,
    Placement,
    ShardedUnitRecord,
    ZeroStage,
)
from planner.schemas.settings import ProfileSettings
from profiler.build import build_profile
from profiler.collectives import CollectiveSample, group_shapes
from profiler.links import LinkSample, duplex_bandwidth, link_figures
from profiler.ops import GemmSample, OpsSample
from profiler.rounds import round_robin
from profiler.stats import Timing
from profiler.topology import RankInfo, device_kind, nic_kind


@given(n=st.integers(2, 33))
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n: int) -> None:
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [pair for r in rounds for pair in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        ranks = [x for pair in r for x in pair]
        assert len(ranks) == len(set(ranks))


def test_timing_median_and_spread() -> None:
    t = Timing.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert t.median_s == 3.0
    assert t.spread == pytest.approx((4.0 - 2.0) / 3.0)
    assert Timing.of([2.0]).spread == 0.0


def test_link_figures_from_ping_pong() -> None:
    # 2 x 10 us latency; 1 MiB more takes 1 ms more: about 1 GiB/s.
    s = LinkSample(0, 1, Timing(20e-6, 0.1), Timing(20e-6 + 1e-3, 0.2))
    bw, lat, spread = link_figures(s, 0, 2**20)
    assert lat == pytest.approx(10e-6)
    assert bw == pytest.approx(2**20 / 1e-3)
    assert spread == 0.2
    # A latency as large as the transfer: bandwidth falls back to bytes / time(large).
    noisy = LinkSample(0, 1, Timing(3e-3, 0.1), Timing(4e-3, 0.2))
    assert link_figures(noisy, 0, 2**20)[0] == pytest.approx(2**20 / 4e-3)


def test_duplex_bandwidth_from_the_exchange() -> None:
    # 10 us latency; 1 MiB each way at once in 2.01 ms: 0.5 GiB/s each way.
    s = LinkSample(0, 1, Timing(20e-6, 0.0), Timing(20e-6 + 1e-3, 0.0), exchange=Timing(10e-6 + 2e-3, 0.1))
    assert duplex_bandwidth(s, 2**20) == pytest.approx(2**20 / 2e-3)
    # A latency of half the exchange or more is noise: bytes / time, a lower bound.
    assert duplex_bandwidth(replace(s, exchange=Timing(18e-6, 0.0)), 2**20) == pytest.approx(2**20 / 18e-6)
    assert duplex_bandwidth(replace(s, exchange=None), 2**20) is None


def test_build_profile_keeps_each_pairs_slowest_duplex_figure_both_ways() -> None:
    infos = _infos(2, 2)
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)

    def sample(src: int, dst: int) -> LinkSample:
        # One way 1 ms per MiB everywhere; both ways at once 1.5 ms, 2.5 ms across ranks 1 and 2
        # (as rank 2 timed it; rank 1 timed 2 ms).
        both_s = {(2, 1): 2.5e-3, (1, 2): 2e-3}.get((src, dst), 1.5e-3)
        return LinkSample(src, dst, Timing(0.0, 0.0), Timing(1e-3, 0.0), exchange=Timing(both_s, 0.0))

    links = [[sample(s, d) for d in range(4) if d != s] for s in range(4)]
    ops = [OpsSample((GemmSample(64, 64, 64, DType.FP32, 1e-4, 0.0),), 1e10, 1e-5) for _ in range(4)]
    profile = build_profile(settings, infos, links, [[] for _ in range(4)], ops, backend="gloo")
    inside, across = profile.intra_node_links, profile.inter_node_links
    assert inside.duplex_bandwidth_bytes_per_s is not None and across.duplex_bandwidth_bytes_per_s is not None
    assert inside.duplex_bandwidth_bytes_per_s[0][1] == inside.duplex_bandwidth_bytes_per_s[1][0]
    assert inside.duplex_bandwidth_bytes_per_s[0][1] == pytest.approx(2**20 / 1.5e-3)
    # Nodes 0 and 1: the slowest of every crossing pair's figures, in both directions.
    assert across.duplex_bandwidth_bytes_per_s[0][1] == pytest.approx(2**20 / 2.5e-3)
    assert across.duplex_bandwidth_bytes_per_s[1][0] == pytest.approx(2**20 / 2.5e-3)
    # A two-node ring sends both ways at once: the duplex figure bounds it; one way stays 1 ms.
    assert across.ring_slowest((0, 1)).bandwidth_bytes_per_s == pytest.approx(2**20 / 2.5e-3)
    assert across.link(0, 1).bandwidth_bytes_per_s == pytest.approx(2**20 / 1e-3)
    # Samples without the exchange (profiles before it) leave the links full duplex.
    bare = [[replace(s, exchange=None) for s in rank] for rank in links]
    old = build_profile(settings, infos, bare, [[] for _ in range(4)], ops, backend="gloo")
    assert old.inter_node_links.duplex_bandwidth_bytes_per_s is None
    assert old.inter_node_links.ring_slowest((0, 1)).bandwidth_bytes_per_s == pytest.approx(2**20 / 1e-3)


def _infos(nodes: int, per_node: int) -> list[RankInfo]:
    return [
        RankInfo(rank=r, host=f"n{r // per_node}", local_rank=r % per_node, local_world_size=per_node,
                 device_name="cpu (test)", device_kind=DeviceKind.CPU, memory_bytes=2**30)
        for r in range(nodes * per_node)
    ]  # fmt: skip


def test_group_shapes_follow_the_topology() -> None:
    shapes = {s.name: s for s in group_shapes(_infos(2, 4))}
    assert shapes["world"].placement is Placement.INTER_NODE and shapes["world"].members_per_node == 4
    assert shapes["consecutive 2"].groups[:2] == ((0, 1), (2, 3))
    assert shapes["strided 2"].groups[:2] == ((0, 2), (1, 3))
    assert shapes["one per node"].groups[0] == (0, 4) and shapes["one per node"].placement is Placement.INTER_NODE


def test_build_profile_is_hierarchical(tmp_path: Path) -> None:
    infos = _infos(2, 2)
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)

    def sample(src: int, dst: int, seconds: float) -> LinkSample:
        return LinkSample(src, dst, Timing(2e-6, 0.0), Timing(2e-6 + seconds, 0.0))

    # Inside nodes: 1 ms per MiB; across nodes: 4 ms (rank 1 -> 3 slower: 8 ms).
    links = [[sample(s, d, 1e-3 if s // 2 == d // 2 else (8e-3 if (s, d) == (1, 3) else 4e-3))
              for d in range(4) if d != s] for s in range(4)]  # fmt: skip
    collectives = [[CollectiveSample("world", CollectiveOp.ALL_REDUCE, 1024, 1e-3 * (r + 1), 0.1)] for r in range(4)]
    ops = [OpsSample((GemmSample(64, 64, 64, DType.FP32, 1e-4, 0.0),), 1e10, 1e-5) for _ in range(4)]
    profile = build_profile(settings, infos, links, collectives, ops, backend="gloo")
    assert (profile.num_nodes, profile.devices_per_node) == (2, 2)
    assert profile.intra_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(2**20 / 1e-3)
    # Node 0 -> node 1 crossings: 0->2, 0->3, 1->2 at 4 ms and 1->3 at 8 ms: the slowest is kept.
    assert profile.inter_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(2**20 / 8e-3)
    assert profile.inter_node_links.link(1, 0).bandwidth_bytes_per_s == pytest.approx(2**20 / 4e-3)
    (record,) = profile.collectives
    assert record.time_s == pytest.approx(4e-3)  # the slowest rank
    assert record.placement is Placement.INTER_NODE and record.members_per_node == 2
    # The world's ring crosses node 0 -> 1 (8 ms per MiB at its slowest) and back: the slower one.
    assert record.ring_bandwidth_bytes_per_s == pytest.approx(2**20 / 8e-3)
    assert profile.device.peak_flop_per_s[DType.FP32] == pytest.approx(2 * 64**3 / 1e-4)
    assert profile.provenance.kind == "measured" and profile.provenance.settings["bandwidth_bytes"] == 2**20


def test_build_profile_keeps_each_ops_median_over_ranks_and_the_device_kind(tmp_path: Path) -> None:
    infos = _infos(1, 4)
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    links = [[LinkSample(s, d, Timing(2e-6, 0.0), Timing(1e-3, 0.0)) for d in range(4) if d != s] for s in range(4)]

    def others(rank: int) -> tuple[LayerRecord | PipelineSlotRecord | ShardedUnitRecord, ...]:
        slow = 1.0 + rank  # rank r takes (1 + r) times as long: the median over 4 ranks is 2.5x
        layer = LayerRecord(
            op=OpKind.TP_LAYER,
            model="tiny-gpt",
            tensor_parallel_degree=2,
            micro_batch_size=4,
            seq_len=128,
            sequence_parallel=True,
            dtype=DType.BF16,
            fwd_time_s=1e-3 * slow,
            fwd_bwd_time_s=3e-3 * slow,
            spread=0.1 * slow,
        )
        slot = PipelineSlotRecord(num_stages=2, dtype=DType.FP32, time_s=1e-4 * slow)
        units = tuple(
            ShardedUnitRecord(zero_stage=zero, deferred=False, dtype=DType.BF16, time_s=1e-5 * slow * zero)
            for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS)
        )
        return (layer, slot, *units)

    ops = [OpsSample((GemmSample(64, 64, 64, DType.FP32, 1e-4, 0.0),), 1e10, 1e-5, others(r)) for r in range(4)]
    profile = build_profile(settings, infos, links, [[] for _ in range(4)], ops, backend="gloo")
    assert profile.device.kind is DeviceKind.CPU
    layer, slot, zero2, zero3 = profile.device.op_records
    assert isinstance(layer, LayerRecord) and layer.sequence_parallel is True and layer.micro_batch_size == 4
    assert (layer.fwd_time_s, layer.fwd_bwd_time_s, layer.spread) == pytest.approx((2.5e-3, 7.5e-3, 0.25))
    assert isinstance(slot, PipelineSlotRecord) and slot.time_s == pytest.approx(2.5e-4)
    assert isinstance(zero3, ShardedUnitRecord) and zero3.zero_stage is ZeroStage.PARAMETERS
    assert (zero2.time_s, zero3.time_s) == pytest.approx((5e-5, 7.5e-5))


def test_the_device_kind_comes_from_the_torch_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_kind(torch.device("cpu")) is DeviceKind.CPU
    monkeypatch.setattr(torch.version, "hip", None)
    assert device_kind(torch.device("cuda", 0)) is DeviceKind.CUDA
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert device_kind(torch.device("cuda", 0)) is DeviceKind.ROCM


def test_build_profile_keeps_each_nodes_own_links_and_interface() -> None:
    infos = _infos(3, 2)
    infos = [replace(i, nic=NicKind.ROCE) if i.rank >= 4 else replace(i, nic=NicKind.INFINIBAND) for i in infos]
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    # Inside node 1: 2 ms per MiB; inside nodes 0 and 2: 1 ms; across nodes 4 ms.
    per_mib_s = {0: 1e-3, 1: 2e-3, 2: 1e-3}
    links = [[LinkSample(s, d, Timing(2e-6, 0.0), Timing(2e-6 + (per_mib_s[s // 2] if s // 2 == d // 2 else 4e-3), 0.0))
              for d in range(6) if d != s] for s in range(6)]  # fmt: skip
    collectives = [[CollectiveSample("world", CollectiveOp.ALL_REDUCE, 1024, 1e-3, 0.1)] for _ in range(6)]
    ops = [OpsSample((GemmSample(64, 64, 64, DType.FP32, 1e-4, 0.0),), 1e10, 1e-5) for _ in range(6)]
    profile = build_profile(settings, infos, links, collectives, ops, backend="gloo")
    bandwidths = [profile.node_links(n).link(0, 1).bandwidth_bytes_per_s for n in range(3)]
    assert bandwidths == pytest.approx([2**20 / 1e-3, 2**20 / 2e-3, 2**20 / 1e-3])  # not the slowest copy
    # Node 1 differs in its links, node 2 in its interface only: one override each.
    assert [(o.nodes, o.intra_node_links is not None, o.nic) for o in profile.node_overrides] == [
        ((1,), True, None),
        ((2,), False, NicKind.ROCE),
    ]
    assert [profile.node_nic(n) for n in range(3)] == [NicKind.INFINIBAND, NicKind.INFINIBAND, NicKind.ROCE]


def test_the_interface_type_comes_from_the_rdma_ports_link_layer(tmp_path: Path) -> None:
    assert nic_kind(tmp_path / "absent") is NicKind.ETHERNET
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    assert nic_kind(tmp_path) is NicKind.ROCE
    (port / "link_layer").write_text("InfiniBand\n")
    assert nic_kind(tmp_path) is NicKind.INFINIBAND


def test_build_profile_keeps_each_device_types_own_measurements() -> None:
    # Node 1's ranks run another device type, with half the memory and GEMMs twice as slow.
    infos = [replace(i, device_name="cpu (other)", memory_bytes=2**29) if i.rank >= 2 else i for i in _infos(2, 2)]
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    links = [[LinkSample(s, d, Timing(2e-6, 0.0), Timing(2e-6 + 1e-3, 0.0)) for d in range(4) if d != s]
             for s in range(4)]  # fmt: skip
    collectives = [[CollectiveSample("world", CollectiveOp.ALL_REDUCE, 1024, 1e-3, 0.1)] for _ in range(4)]
    ops = [OpsSample((GemmSample(64, 64, 64, DType.FP32, 1e-4 * (1 + r // 2), 0.0),), 1e10, 1e-5) for r in range(4)]
    profile = build_profile(settings, infos, links, collectives, ops, backend="gloo")
    (override,) = profile.node_overrides
    assert override.nodes == (1,) and override.intra_node_links is None and override.device is not None
    assert (profile.device.name, override.device.name) == ("cpu (test)", "cpu (other)")
    assert [profile.node_device(n).matmul_records[0].time_s for n in (0, 1)] == pytest.approx([1e-4, 2e-4])
    assert profile.pricing_device.name == "cpu (other)" and profile.pricing_device.memory_bytes == 2**29
