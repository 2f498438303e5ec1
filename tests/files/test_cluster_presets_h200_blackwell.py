"""The dgx-h200, dgx-b200 and gb200-nvl72 cluster presets: each loads, and its key figures are
the values its sources publish (planner/presets/clusters/*.yaml names them)."""

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import load_cluster
from planner.schemas import AttentionKernel, AttentionRecord, ClusterProfile, DType

# name: (GPUs per node, nvidia-smi's total in MiB, dense BF16 peak, FP32 peak, sustained BF16
# matmul = burst MAMF x sustained/burst, ring busbw over NVLink)
PUBLISHED = {
    # ml-engineering: 989 / 67 TFLOPS; 143771 MiB; 8 busy H200s 823.9 x 0.848 (698.6 measured);
    # ring 367.61 GB/s at 16 GiB.
    "dgx-h200": (8, 143771, 989e12, 67e12, 823.9e12 * 0.848, 367.61e9),
    # ml-engineering: 2250 / 80 TFLOPS; TensorRT-LLM #10278: 183359 MiB; 8 busy B200s
    # 1751.2 x 0.815 (1426.4 measured); ring 682.2 GB/s at 8 GiB.
    "dgx-b200": (8, 183359, 2250e12, 80e12, 1751.2e12 * 0.815, 682.2e9),
    # ml-engineering: 2500 / 80 TFLOPS per GPU; 189471 MiB; MAMF 1822.0 x B200's 0.815 (assumed);
    # NVIDIA GTC25: ring 680 GB/s over the NVL72 domain.
    "gb200-nvl72": (72, 189471, 2500e12, 80e12, 1822.0e12 * 0.815, 680e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_new_preset_loads_with_its_published_figures(name: str) -> None:
    per_node, mib, bf16, fp32, sustained, ring = PUBLISHED[name]
    cluster = load_cluster(f"{name}:2")
    device = cluster.device
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.world_size) == (2, per_node, 2 * per_node)
    assert device.memory_bytes == mib * 2**20
    assert device.get_peak_flop_per_s(DType.BF16) == bf16 == device.get_peak_flop_per_s(DType.FP16)
    assert device.get_peak_flop_per_s(DType.FP32) == fp32
    # Training runs the matmul at the sustained rate: peak_fraction x peak.
    assert device.matmul.peak_fraction * bf16 == pytest.approx(sustained, rel=1e-12)
    assert cluster.intra_node_links.uniform is not None
    assert cluster.intra_node_links.uniform.bandwidth_bytes_per_s == ring
    # One NDR 400 Gb/s NIC per GPU at 48 of 50 GB/s (nccl-tests #267).
    assert cluster.inter_node_links.uniform is not None
    assert cluster.inter_node_links.uniform.bandwidth_bytes_per_s == pytest.approx(48e9, rel=1e-12)
    assert ClusterProfile.model_validate_json(cluster.model_dump_json()) == cluster


def test_the_h200_keeps_the_h100s_compute_and_its_measured_small_message_all_reduce() -> None:
    h100, h200 = load_cluster("dgx-h100:1"), load_cluster("dgx-h200:1")
    assert h200.device.peak_flop_per_s == h100.device.peak_flop_per_s
    # Its own memory bandwidth: 4.8 vs 3.35 TB/s nominal, the same achievable fraction.
    ratio = h200.device.memory_bandwidth_bytes_per_s / h100.device.memory_bandwidth_bytes_per_s
    assert ratio == pytest.approx(4.8 / 3.35, rel=1e-12)
    # The 32 KiB all-reduce measured on 8 H200s: busbw 1.44 GB/s, time = 2(n-1)/n x bytes / busbw.
    small = min(h200.collectives, key=lambda r: r.message_bytes)
    assert small.message_bytes == 32768
    assert small.time_s == pytest.approx(32768 * 2 * 7 / 8 / 1.44e9, rel=1e-12)


def test_the_blackwell_presets_hold_both_attention_kernels_and_no_collective_records() -> None:
    # cudnn-frontend's benchmark publishes FlashAttention-2 and cuDNN on each (6 lengths, head
    # size 128); no per-size collective curve is published: rings over the link (header comments).
    for name in ("dgx-b200", "gb200-nvl72"):
        cluster = load_cluster(f"{name}:1")
        records = cluster.device.op_records
        assert all(isinstance(r, AttentionRecord) and r.head_size == 128 for r in records)
        assert sorted(r.kernel for r in records) == [AttentionKernel.CUDNN] * 6 + [AttentionKernel.FLASH] * 6
        assert cluster.collectives == ()


def test_planner_presets_lists_the_new_clusters() -> None:
    result = CliRunner().invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in PUBLISHED:
        assert f"{name}:NODES" in result.output
