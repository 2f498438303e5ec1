"""The run summary's memory lines: on a CPU run one line as before (tensors beside the whole
estimate, which holds no workspace there); on CUDA the measured tensors beside the estimate less
its workspace, and a second line with what is not tensors (allocator slack; context, libraries
and NCCL) beside the workspace the estimate assumed."""

from datetime import UTC, datetime

from planner.schemas import Layout, RankMemory, RunReport
from planner.views.tables import run_summary

MIB = 2**20


def _report(*memory: RankMemory, device: str = "cpu") -> RunReport:
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    return RunReport(
        created=datetime(2026, 1, 1, tzinfo=UTC),
        plan_sha256="0" * 64,
        model="tiny-gpt",
        layout=layout,
        world_size=len(memory),
        backend="nccl" if device == "cuda" else "gloo",
        device=device,
        torch_version="2.13",
        hosts=("a",),
        precision="bf16 weights and compute",
        optimizer="adamw",
        steps=2,
        warmup_steps=1,
        step_times_s=(0.2, 0.1),
        losses=(7.0, 6.9),
        measured_step_time_s=0.1,
        predicted_step_time_s=0.1,
        measured_tokens_per_s=1.0,
        predicted_tokens_per_s=1.0,
        memory=memory,
    )


def test_a_cpu_run_compares_tensors_with_the_whole_estimate_in_one_line() -> None:
    memory = RankMemory(rank=0, stage=0, peak_bytes=100 * MIB, predicted_bytes=110 * MIB, method="MemTracker")
    lines = run_summary(_report(memory)).splitlines()
    assert lines[3:] == ["  peak memory measured 100.0 MiB (rank 0, MemTracker)   predicted 110.0 MiB"]


def test_a_cuda_run_compares_tensors_with_the_estimate_less_its_workspace_and_splits_the_rest() -> None:
    memory = RankMemory(
        rank=1,
        stage=0,
        peak_bytes=2000 * MIB,
        predicted_bytes=3048 * MIB,  # 2024 MiB of tensors + the 1 GiB workspace
        method="cuda max_memory_allocated",
        predicted_workspace_bytes=1024 * MIB,
        reserved_bytes=2100 * MIB,
        driver_used_bytes=2600 * MIB,
    )
    smaller = memory.model_copy(update={"rank": 0, "peak_bytes": 10 * MIB})
    lines = run_summary(_report(smaller, memory, device="cuda")).splitlines()
    assert lines[3:] == [
        "  peak memory measured 2000.0 MiB (rank 1, cuda max_memory_allocated)   predicted 2024.0 MiB of tensors   "
        "ratio 0.99   (+ 1024.0 MiB workspace: 3048.0 MiB)",
        "  beyond tensors allocator slack 100.0 MiB (reserved 2100.0)   context, libraries, NCCL 500.0 MiB "
        "(driver used 2600.0)   measured workspace 600.0 MiB   assumed 1024.0 MiB",
    ]


def test_an_older_cuda_report_without_the_driver_figures_still_compares_tensors() -> None:
    memory = RankMemory(
        rank=0,
        stage=0,
        peak_bytes=2000 * MIB,
        predicted_bytes=3048 * MIB,
        method="cuda max_memory_allocated",
        predicted_workspace_bytes=1024 * MIB,
    )
    lines = run_summary(_report(memory, device="cuda")).splitlines()
    assert len(lines) == 4 and "predicted 2024.0 MiB of tensors" in lines[3]
