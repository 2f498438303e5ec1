"""The runtime's CUDA branches, on a GPU (skipped without one): a one-rank ``planner run`` on
cuda:0 (finite losses; the tensors' peak, the allocator's and the driver's in the report; tensors
within 5% of the estimate less its workspace), the collective clock timing by CUDA events (queued
compute before a collective counts as compute, not as time inside it), the straggler watch on
in that run, and on four GPUs a slowed link named as on the CPU."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster, save_cluster
from planner.files.plans import make_plan, save_plan
from planner.flows.replan import survivors
from planner.schemas import DType, Layout, ModelSpec, RunReport, TrainingSpec
from runtime.collective_clock import CollectiveClock

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]
MODEL = ModelSpec(  # 0.2B parameters: 3 GiB of model states, so a cuBLAS workspace is under 1% of it
    name="gpu-check-0.2b",
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=4096,
    vocab_size=32000,
    hidden_act="silu",
    tie_word_embeddings=False,
)
TRAINING = TrainingSpec(global_batch_size=8, seq_len=1024, dtype=DType.BF16)
MEMORY_TOLERANCE = 0.05


def _plan(tmp_path: Path, devices: int, dp: int = 1, tp: int = 1) -> Path:
    """A plan of MODEL on the first ``devices`` GPUs of a DGX H100 (its published figures)."""
    cluster = survivors(load_cluster("dgx-h100:1"), devices)
    save_cluster(cluster, tmp_path / "cluster.json")
    chosen = Layout(data_parallel_degree=dp, tensor_parallel_degree=tp, pipeline_parallel_degree=1, micro_batch_size=2)
    plan = make_plan(
        MODEL, TRAINING, cluster, str(tmp_path / "cluster.json"), chosen, estimate(MODEL, TRAINING, cluster, chosen)
    )
    save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def _torchrun(tmp_path: Path, ranks: int, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [*command, "-m", "planner", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module")
def one_gpu_report(tmp_path_factory: pytest.TempPathFactory) -> RunReport:
    """A one-rank run of MODEL on cuda:0 (6 steps; the straggler watch on, with no peer to judge)."""
    tmp_path = tmp_path_factory.mktemp("one-gpu")
    plan = _plan(tmp_path, 1)
    proc = _torchrun(tmp_path, 1, str(plan), "--steps", "6", "--report", str(tmp_path / "report.json"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return RunReport.model_validate_json((tmp_path / "report.json").read_text())


def test_a_one_rank_run_on_cuda_trains_and_reports_three_memory_figures(one_gpu_report: RunReport) -> None:
    report = one_gpu_report
    assert report.device == "cuda" and report.backend == "nccl"
    assert all(torch.isfinite(torch.tensor(report.losses))) and report.losses[-1] < report.losses[0]
    assert report.precision.startswith("bf16 weights and compute, fp32 master weights")
    (memory,) = report.memory
    assert memory.method == "cuda max_memory_allocated"
    assert memory.reserved_bytes is not None and memory.driver_used_bytes is not None
    assert memory.peak_bytes <= memory.reserved_bytes <= memory.driver_used_bytes
    assert memory.predicted_workspace_bytes > 0
    ratio = memory.peak_bytes / memory.tensors_predicted_bytes
    assert abs(ratio - 1) < MEMORY_TOLERANCE, (
        f"tensors {memory.peak_bytes / 2**20:.1f} MiB, estimate less workspace "
        f"{memory.tensors_predicted_bytes / 2**20:.1f} MiB; reserved {memory.reserved_bytes / 2**20:.1f} MiB, "
        f"driver used {memory.driver_used_bytes / 2**20:.1f} MiB"
    )


def test_the_straggler_watch_runs_on_cuda_without_peers(one_gpu_report: RunReport) -> None:
    # one rank: nothing to compare with, so nothing judged; the events were recorded and read
    assert one_gpu_report.stragglers == () and one_gpu_report.straggler_checks == 0
    assert len(one_gpu_report.step_times_s) == 6 and min(one_gpu_report.step_times_s) > 0


def test_the_collective_clock_counts_queued_compute_as_compute_on_cuda(tmp_path: Path) -> None:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        flag = torch.ones(1, device=device)
        dist.all_reduce(flag)  # NCCL's communicator is built lazily: not inside the timed part
        torch.cuda.synchronize(device)
        clock = CollectiveClock(device)
        with clock.running():
            for _ in range(20):  # ~0.5 PFLOP queued: tens of ms on an H100
                x = x @ x / 8192
            dist.all_reduce(flag)
        torch.cuda.synchronize(device)
        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        begin.record()
        for _ in range(20):
            x = x @ x / 8192
        end.record()
        torch.cuda.synchronize(device)
        compute_s = begin.elapsed_time(end) / 1e3
        assert compute_s > 5e-3  # the matmuls are real work
        assert 0 < clock.inside_s < 0.1 * compute_s, (clock.inside_s, compute_s)
        assert clock.inside_by_group_s == {(0,): clock.inside_s}
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="a slowed link needs tp2 x dp2: four GPUs")
def test_a_slowed_link_is_named_on_four_gpus(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 4, dp=2, tp=2)
    args = [str(plan), "--steps", "24", "--report", str(tmp_path / "r.json"), "--inject-fault", "0,2,slow-link,1"]
    proc = _torchrun(tmp_path, 4, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = RunReport.model_validate_json((tmp_path / "r.json").read_text())
    assert report.stragglers == ()
    assert [(link.ranks, link.axis) for link in report.slow_links] == [((0, 1), "tp")]
