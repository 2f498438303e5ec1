"""`planner profile` on one GPU (cuda:0, NCCL): the CUDA branches of the profiler, run for real.

One one-rank profile (``gpu_profile``) serves every check: the lockstep counters reduced under
NCCL (the run completes), attention timed by FlashAttention and cuDNN in bf16, the GEMM efficiency
per precision against the published peak, the library workspace measured, the runtime's own
layer and optimizer timed, and the profile pricing a one-rank plan. The model is Llama 3 8B at
1k tokens, so that its own GEMMs (1024 x 4096 x 14336 and larger) are large enough to show the
tensor cores' sustained rate (the quick default shapes, 1024^3 at most, run well below it on an
H100); one layer of it fits in fp32 with its optimizer state.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness import planner_main

from planner.files.clusters import load_cluster
from planner.schemas import (
    AttentionKernel,
    AttentionRecord,
    ClusterProfile,
    DeviceKind,
    DType,
    LayerRecord,
    OpKind,
    OptimizerRecord,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the profiler's CUDA branches)"),
]

MODEL = ["--model", "llama3-8b", "--seq-len", "1024"]


@pytest.fixture(scope="module")
def gpu_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClusterProfile, Path, str]:
    """A quick one-rank profile of cuda:0 in fp32 and bf16, the layer at micro-batch 1 only."""
    out = tmp_path_factory.mktemp("gpu") / "cluster.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "planner",
           "profile", "--output", str(out), "--quick", *MODEL,
           "--layer-micro-batches", "1", "--layer-repeats", "3"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output  # NCCL took the lockstep counters (they are on the GPU)
    return load_cluster(str(out)), out, output


def test_one_gpu_profiles_and_says_what_one_rank_cannot_measure(gpu_profile: tuple[ClusterProfile, Path, str]) -> None:
    profile, _, output = gpu_profile
    assert profile.world_size == 1 and profile.device.kind is DeviceKind.CUDA
    assert profile.provenance.backend == "nccl" and profile.collectives == ()
    assert "not measured: links" in output and any("links" in s for s in profile.provenance.not_measured)


def test_flash_attention_is_timed_in_bf16_and_nothing_in_fp32(gpu_profile: tuple[ClusterProfile, Path, str]) -> None:
    records = [r for r in gpu_profile[0].device.op_records if isinstance(r, AttentionRecord)]
    assert {(r.kernel, r.causal) for r in records if r.dtype is DType.BF16} >= {
        (AttentionKernel.FLASH, True),
        (AttentionKernel.FLASH, False),
    }
    assert all(r.dtype is not DType.FP32 for r in records)  # both kernels refuse fp32
    assert max(r.seq_len for r in records) == 16384


def test_the_gemm_efficiency_is_measured_per_precision(gpu_profile: tuple[ClusterProfile, Path, str]) -> None:
    device = gpu_profile[0].device
    units = torch.cuda.get_device_properties(0).multi_processor_count
    assert (device.matmul.tile_m, device.matmul.tile_n, device.matmul.compute_units) == (256, 128, units)
    if not any(name in device.name for name in ("H100", "H200")):
        pytest.skip(f"the published-peak check is written for an H100 or H200, not a {device.name}")
    assert device.peak_flop_per_s[DType.BF16] == 989e12 and device.peak_flop_per_s[DType.FP32] == 67e12
    assert set(device.matmul.peak_fraction_by_dtype) == {DType.FP32, DType.BF16}
    assert device.matmul.fraction(DType.BF16) > 0.3  # sustained tensor-core bf16: ~0.7 on an SXM H100
    assert device.matmul.fraction(DType.FP32) > 0.3  # CUDA cores, true fp32 (TF32 off)


def test_the_library_workspace_is_measured(gpu_profile: tuple[ClusterProfile, Path, str]) -> None:
    workspace = gpu_profile[0].device.workspace_bytes
    assert workspace is not None and 0 < workspace < 8 * 2**30


def test_hbm_is_streamed_past_the_l2_and_host_copies_are_measured(
    gpu_profile: tuple[ClusterProfile, Path, str],
) -> None:
    device = gpu_profile[0].device
    # an H100 SXM's HBM3 is 3.35 TB/s; a stream kernel that fits the 50 MiB L2 would read far above it
    assert 1.5e12 < device.memory_bandwidth_bytes_per_s < 3.35e12
    # pinned copies over PCIe 5.0 x16 (64 GB/s raw a way): a few to ~55 GB/s
    assert device.host_to_device_bytes_per_s is not None and 5e9 < device.host_to_device_bytes_per_s < 64e9
    assert device.device_to_host_bytes_per_s is not None and 5e9 < device.device_to_host_bytes_per_s < 64e9


def test_the_runtimes_layer_and_optimizer_are_timed_in_each_precision(
    gpu_profile: tuple[ClusterProfile, Path, str],
) -> None:
    records = gpu_profile[0].device.op_records
    layers = {r.dtype: r for r in records if isinstance(r, LayerRecord) and r.op is OpKind.LAYER}
    steps = {r.dtype: r for r in records if isinstance(r, OptimizerRecord)}
    assert set(layers) == set(steps) == {DType.FP32, DType.BF16}
    assert layers[DType.BF16].fwd_bwd_time_s < layers[DType.FP32].fwd_bwd_time_s
    assert steps[DType.FP32].num_parameters == steps[DType.BF16].num_parameters == 218_112_000


def test_the_gpu_profile_prices_a_one_rank_plan(
    gpu_profile: tuple[ClusterProfile, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tiny-gpt fits one GPU (Llama 3 8B's states do not): priced from the GEMM model and the bf16
    # attention records
    args = ["search", "--model", "tiny-gpt", "--global-batch-size", "8", "--seq-len", "512", "--dtype", "bf16",
            "--dp", "1", "--tp", "1", "--pp", "1", "--cluster", str(gpu_profile[1]),
            "--output", str(tmp_path / "plan.json")]  # fmt: skip
    code, stdout, err = planner_main(args, monkeypatch)
    assert code == 0, stdout + err
    assert json.loads((tmp_path / "plan.json").read_text())["estimate"]["step_time_s"] > 0
