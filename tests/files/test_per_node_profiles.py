"""Cluster profiles that keep what differs node by node (schema version 4): a version-3 profile
read as it was, mixed clusters from presets and from hand-written files, and refusals that name
the field and the fix."""

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import api
from planner.files.clusters import load_cluster, save_cluster
from planner.schemas import ClusterProfile, DType, Layout, LinkMatrix, LinkProfile, NicKind, NodeOverride, TrainingSpec
from planner.schemas.errors import SchemaError

V3_TWO_NODES = Path(__file__).resolve().parents[1] / "golden" / "cluster_profile_v3_cpu_two_nodes.json"
"""Written by the version-3 profiler (``profiler.build``) from 2 nodes x 2 CPU ranks whose pair
on node 1 took 2 ms per MiB and on node 0 1 ms: it kept the slowest copy for every node."""


def test_a_version_3_profile_reads_as_every_node_alike() -> None:
    profile = load_cluster(str(V3_TWO_NODES))
    assert profile.schema_version == 12 and profile.node_overrides == () and profile.nic is None
    slowest_copy = 2**20 / 2e-3
    for node in (0, 1):
        assert profile.node_links(node).link(0, 1).bandwidth_bytes_per_s == pytest.approx(slowest_copy)
    assert profile.inter_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(2**20 / 4e-3)


def test_a_version_3_profile_saves_as_the_current_version_and_loads_the_same(tmp_path: Path) -> None:
    profile = load_cluster(str(V3_TWO_NODES))
    path = tmp_path / "cluster.json"
    save_cluster(profile, path)
    raw = json.loads(path.read_text())
    old = json.loads(V3_TWO_NODES.read_text())
    assert raw["schema_version"] == 12 and raw["node_overrides"] == [] and raw["nic"] is None
    assert raw["intra_node_links"] == {
        **old["intra_node_links"],
        "endpoints": None,
        "duplex_bandwidth_bytes_per_s": None,
    }
    assert load_cluster(str(path)) == profile


def test_a_mixed_preset_keeps_each_parts_devices_links_and_curves() -> None:
    mixed = load_cluster("dgx-a100-80g:4+dgx-h100:4")
    a100, h100 = load_cluster("dgx-a100-80g:1"), load_cluster("dgx-h100:1")
    assert (mixed.num_nodes, mixed.devices_per_node, mixed.name) == (8, 8, "dgx-a100-80g:4+dgx-h100:4")
    assert [mixed.node_device(n).name for n in (0, 3, 4, 7)] == [a100.device.name] * 2 + [h100.device.name] * 2
    assert mixed.node_links(0) == a100.intra_node_links and mixed.node_links(4) == h100.intra_node_links
    assert mixed.node_collectives(5) == h100.collectives and mixed.node_collectives(2) == a100.collectives
    assert {mixed.node_nic(n) for n in range(8)} == {NicKind.INFINIBAND}
    # Rails: HDR 25e9 x 0.96 on A100 nodes, NDR 50e9 x 0.96 on H100 nodes; a pair at its slower end.
    assert mixed.inter_node_links.link(4, 7).bandwidth_bytes_per_s == pytest.approx(48e9)
    assert mixed.inter_node_links.link(0, 7).bandwidth_bytes_per_s == pytest.approx(24e9)
    # Priced conservatively: the A100's rates, the smaller memory of the two (H100's 85.52e9 bytes).
    assert mixed.pricing_device.peak_flop_per_s == a100.device.peak_flop_per_s
    assert mixed.pricing_device.memory_bytes == min(a100.device.memory_bytes, h100.device.memory_bytes)


def test_a_large_mixed_preset_stays_small() -> None:
    mixed = load_cluster("dgx-a100-80g:640+dgx-h100:640")  # 10,240 devices
    assert len(mixed.model_dump_json()) < 150_000


def test_one_preset_twice_is_that_preset() -> None:
    twice, once = load_cluster("dgx-h100:2+dgx-h100:3"), load_cluster("dgx-h100:5")
    assert twice.node_overrides == () and twice.inter_node_links == once.inter_node_links
    assert twice.model_dump(exclude={"name"}) == once.model_dump(exclude={"name"})


def test_mixed_presets_of_different_node_sizes_are_refused_with_the_fix() -> None:
    with pytest.raises(SchemaError, match=r"dgx-h100 8, gb200-nvl72 72 devices per node.*mix presets of one node size"):
        load_cluster("dgx-h100:2+gb200-nvl72:1")
    with pytest.raises(SchemaError, match=r"unknown cluster preset 'dgx-x'"):
        load_cluster("dgx-h100:2+dgx-x:1")


def _hand_written(tmp_path: Path, **changes: object) -> Path:
    """dgx-h100:4 as a file, with ``changes`` written in by hand."""
    raw = json.loads(load_cluster("dgx-h100:4").model_dump_json())
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({**raw, **changes}))
    return path


def test_a_hand_written_cluster_of_infiniband_and_roce_nodes(tmp_path: Path) -> None:
    ib = {"bandwidth_bytes_per_s": 48e9, "latency_s": 5e-6}
    roce = {"bandwidth_bytes_per_s": 40e9, "latency_s": 8e-6}
    path = _hand_written(
        tmp_path,
        node_overrides=[{"nodes": [2, 3], "nic": "roce"}],
        inter_node_links={"size": 4, "endpoints": [ib, ib, roce, roce]},
    )
    cluster = load_cluster(str(path))
    assert [cluster.node_nic(n) for n in range(4)] == [NicKind.INFINIBAND] * 2 + [NicKind.ROCE] * 2
    assert cluster.inter_node_links.link(1, 2).latency_s == 8e-6
    assert not cluster.has_mixed_devices


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ([{"nodes": [4], "nic": "roce"}], r"node_overrides\[0\] names node 4.*num_nodes=4.*drop it or raise num_nodes"),
        (
            [{"nodes": [1], "nic": "roce"}, {"nodes": [1, 2], "nic": "ethernet"}],
            r"node_overrides\[1\] names node 1 again",
        ),
        ([{"nodes": [2, 1], "nic": "roce"}], r"must be distinct node numbers >= 0, ascending"),
        ([{"nodes": [1]}], r"changes nothing; set device, intra_node_links, nic or collectives, or remove it"),
        (
            [
                {
                    "nodes": [1],
                    "intra_node_links": {"size": 4, "uniform": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0}},
                }
            ],
            r"node_overrides\[0\]\.intra_node_links\.size=4 must equal devices_per_node=8",
        ),
        ([{"nodes": [1], "nic": "token-ring"}], r"node_overrides\.0\.nic='token-ring'"),
    ],
)
def test_a_bad_node_override_is_refused_naming_the_field_and_the_fix(
    tmp_path: Path, overrides: list[dict[str, object]], needle: str
) -> None:
    with pytest.raises(SchemaError, match=needle):
        load_cluster(str(_hand_written(tmp_path, node_overrides=overrides)))


def test_a_node_override_holds_only_its_nodes_own_curves(tmp_path: Path) -> None:
    record = {"op": "all_reduce", "placement": "inter_node", "group_size": 2, "members_per_node": 1,
              "message_bytes": 1024, "time_s": 1e-4}  # fmt: skip
    with pytest.raises(SchemaError, match=r"put records across nodes in the cluster's collectives"):
        load_cluster(str(_hand_written(tmp_path, node_overrides=[{"nodes": [1], "collectives": [record]}])))


def test_endpoints_must_name_one_link_per_node(tmp_path: Path) -> None:
    link = {"bandwidth_bytes_per_s": 48e9, "latency_s": 5e-6}
    with pytest.raises(SchemaError, match=r"endpoints lists 3 links; give one per endpoint, 4"):
        load_cluster(str(_hand_written(tmp_path, inter_node_links={"size": 4, "endpoints": [link] * 3})))


def test_the_planner_says_how_it_prices_mixed_devices(caplog: pytest.LogCaptureFixture) -> None:
    training = TrainingSpec(global_batch_size=64, seq_len=2048, dtype=DType.BF16)
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=8, pipeline_parallel_degree=1, micro_batch_size=1)
    with caplog.at_level(logging.INFO, logger="planner.flows.loading"):
        mixed = api.estimate("llama3-8b", "dgx-a100-80g:4+dgx-h100:4", training, layout)
    (note,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note:")]
    assert "each pipeline stage is priced on its own ranks' devices" in note
    assert "spanning several types as the slowest (NVIDIA A100-SXM4-80GB) with the smallest memory (85.5 GB)" in note
    assert mixed.step_time_s > api.estimate("llama3-8b", "dgx-h100:8", training, layout).step_time_s


@settings(max_examples=25, deadline=None)
@given(
    kinds=st.lists(st.sampled_from([None, *NicKind]), min_size=4, max_size=4),
    slow_nodes=st.sets(st.integers(0, 3)),
    rails_gb=st.lists(st.floats(1.0, 100.0), min_size=4, max_size=4),
)
def test_a_per_node_profile_round_trips_through_its_file(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[NicKind | None], slow_nodes: set[int], rails_gb: list[float]
) -> None:
    base = load_cluster("dgx-h100:4")
    slow = LinkMatrix(size=8, uniform=LinkProfile(bandwidth_bytes_per_s=100e9, latency_s=3e-6))
    overrides = [NodeOverride(nodes=(n,), nic=kinds[n], intra_node_links=slow if n in slow_nodes else None)
                 for n in range(4) if kinds[n] is not None or n in slow_nodes]  # fmt: skip
    rails = tuple(LinkProfile(bandwidth_bytes_per_s=gb * 1e9, latency_s=5e-6) for gb in rails_gb)
    profile = ClusterProfile.model_validate(
        {**dict(base), "node_overrides": overrides, "inter_node_links": LinkMatrix(size=4, endpoints=rails)}
    )
    path = tmp_path_factory.mktemp("round-trip") / "cluster.json"
    save_cluster(profile, path)
    loaded = load_cluster(str(path))
    assert loaded == profile
    assert [loaded.node_links(n) == slow for n in range(4)] == [n in slow_nodes for n in range(4)]
