"""The frontier-mi250x preset: one GCD per device, eight per node, and its three link levels (the
two GCDs of one MI250X, GCDs on two packages, the network) in that order of speed; and the preset
reader's pair-by-pair node links and shared NICs that express them."""

from importlib import resources
from typing import Any

import pytest
import yaml

from cost_models.comm import Group, collective_time_s
from planner.files import cluster_presets
from planner.files.clusters import load_cluster
from planner.schemas import ClusterProfile, CollectiveOp, DeviceKind, DType
from planner.schemas.errors import SchemaError

# Peak per direction x the assumed ring efficiency 0.78 (the preset's sources and assumptions).
SAME_GPU_BPS = 200e9 * 0.78
TWO_LINKS_BPS = 100e9 * 0.78
ONE_LINK_BPS = 50e9 * 0.78
# One 25 GB/s Slingshot NIC per MI250X at 0.96, shared by its two GCDs.
PER_GCD_RAIL_BPS = 25e9 * 0.96 / 2


def _raw() -> dict[str, Any]:
    text = (resources.files("planner") / "presets" / "clusters" / "frontier-mi250x.yaml").read_text()
    raw: dict[str, Any] = yaml.safe_load(text)
    return raw


def test_the_preset_loads_one_gcd_per_device_eight_per_node() -> None:
    cluster = load_cluster("frontier-mi250x:6")
    device = cluster.device
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.world_size) == (6, 8, 48)
    assert device.kind is DeviceKind.ROCM
    assert device.memory_bytes == 64 * 2**30
    # Half a package: 383 TFLOP/s bf16, 47.9 fp32, 3.2 TB/s per MI250X.
    assert device.get_peak_flop_per_s(DType.BF16) == 191.5e12 == device.get_peak_flop_per_s(DType.FP16)
    assert device.get_peak_flop_per_s(DType.FP32) == 23.95e12
    assert device.memory_bandwidth_bytes_per_s == pytest.approx(1.6e12 * 0.846, rel=1e-12)
    # 147 TFLOP/s measured on one GCD, sustained at 0.848 of the burst.
    assert device.matmul.peak_fraction * 191.5e12 == pytest.approx(147e12 * 0.848, rel=1e-12)
    assert device.matmul.compute_units == 110
    assert cluster.device.op_records == () and cluster.collectives == ()
    assert ClusterProfile.model_validate_json(cluster.model_dump_json()) == cluster


def test_the_three_link_levels_are_ordered_same_gpu_then_cross_gpu_then_network() -> None:
    cluster = load_cluster("frontier-mi250x:2")
    node = cluster.intra_node_links
    same_gpu = node.link(0, 1).bandwidth_bytes_per_s
    cross_gpu = [node.link(0, 6).bandwidth_bytes_per_s, node.link(0, 2).bandwidth_bytes_per_s]
    network = cluster.inter_node_links.link(0, 1).bandwidth_bytes_per_s
    assert same_gpu == pytest.approx(SAME_GPU_BPS)
    assert cross_gpu == pytest.approx([TWO_LINKS_BPS, ONE_LINK_BPS])
    assert network == pytest.approx(PER_GCD_RAIL_BPS)
    assert same_gpu > max(cross_gpu) and min(cross_gpu) > network


def test_each_gcd_has_one_package_partner_and_the_matrix_is_symmetric() -> None:
    arrays = load_cluster("frontier-mi250x:1").intra_node_links.arrays()
    bandwidth, latency = arrays.bandwidth_bytes_per_s, arrays.latency_s
    assert (bandwidth == bandwidth.T).all() and (latency == latency.T).all()
    for gcd in range(8):
        row = bandwidth[gcd]
        assert row[gcd] == 0.0  # no link to itself, as the profiler stores it
        assert [peer for peer in range(8) if row[peer] == pytest.approx(SAME_GPU_BPS)] == [gcd ^ 1]
    # Pairs with no direct link go through a third GCD: two hops of latency.
    assert latency[0, 3] == pytest.approx(2 * latency[0, 1])


def test_a_gather_inside_one_package_beats_one_across_packages() -> None:
    # All-gather of 1 GB over 2 ranks: 1 step of latency + half the buffer over the link.
    cluster = load_cluster("frontier-mi250x:1")
    same = collective_time_s(CollectiveOp.ALL_GATHER, 1e9, Group(devices=(0, 1)), cluster)
    cross = collective_time_s(CollectiveOp.ALL_GATHER, 1e9, Group(devices=(0, 2)), cluster)
    assert same == pytest.approx(3.1e-6 + 0.5e9 / SAME_GPU_BPS)
    assert cross == pytest.approx(3.1e-6 + 0.5e9 / ONE_LINK_BPS)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw["intra_node_link"]["pairs"][0].__setitem__(0, "same_gpu"), r"pairs\[0\]\[0\]='same_gpu'"),
        (lambda raw: raw["intra_node_link"]["pairs"][2].__setitem__(5, "-"), r"pairs\[2\]\[5\]='-'.*diagonal"),
        (lambda raw: raw["intra_node_link"]["pairs"][1].__setitem__(0, "nvlink"), r"'nvlink' is not one of"),
        (lambda raw: raw["intra_node_link"]["pairs"].pop(), r"pairs must be 8 rows of 8"),
    ],
)
def test_the_pair_table_refuses_what_it_cannot_read(edit: Any, message: str) -> None:
    raw = _raw()
    edit(raw)
    with pytest.raises(SchemaError, match=message):
        cluster_presets._build_cluster(raw, name="frontier-mi250x", num_nodes=1)


def test_a_figure_of_the_pair_table_or_the_shared_nic_must_be_traced() -> None:
    raw = _raw()
    del raw["intra_node_link"]["link_classes"]["two_hops"]["latency_s"]["source"]
    del raw["intra_node_link"]["link_classes"]["two_hops"]["latency_s"]["assumption"]
    with pytest.raises(SchemaError, match="'latency_s' names no source"):
        cluster_presets._build_cluster(raw, name="frontier-mi250x", num_nodes=1)
    raw = _raw()
    raw["inter_node_link"]["devices_per_nic"]["source"] = "nowhere"
    with pytest.raises(SchemaError, match="'devices_per_nic' names source 'nowhere'"):
        cluster_presets._build_cluster(raw, name="frontier-mi250x", num_nodes=1)


def test_one_nic_per_device_is_the_default() -> None:
    raw = _raw()
    del raw["inter_node_link"]["devices_per_nic"]
    cluster = cluster_presets._build_cluster(raw, name="frontier-mi250x", num_nodes=2)
    assert cluster.inter_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(2 * PER_GCD_RAIL_BPS)
