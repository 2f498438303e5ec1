"""The dry run traces the real runtime under fake tensors: it agrees with a real run's tracked peak
(same method), and checks plans far larger than this machine without allocating them."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_cli import _local_plan

from cost_models.estimate import estimate
from planner.inputs import load_cluster, load_model
from planner.plans import make_plan, save_plan
from planner.schemas import Layout, TrainingSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _dry(plan: Path, rank: int) -> float:
    """Traced peak MiB of ``rank`` via the CLI, in a fresh process (one fake world per process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "run", str(plan), "--dry-run", "--rank", str(rank)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("│")]
    return float(row.split("│")[3].replace(",", ""))


@pytest.mark.distributed
def test_dry_run_matches_the_real_runs_tracked_peak(tmp_path: Path) -> None:
    plan = _local_plan(tmp_path)
    report = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "planner",
        "run",
        str(plan),
        "--steps",
        "3",
        "--report",
        str(report),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = {m["rank"]: m for m in json.loads(report.read_text())["memory"]}
    assert measured[0]["method"] == "MemTracker"
    assert _dry(plan, 0) == pytest.approx(measured[0]["peak_bytes"] / 2**20, rel=0.05)


def test_dry_run_of_a_large_plan_allocates_nothing(tmp_path: Path) -> None:
    # Llama 3 8B on 64 H100s: several GiB per rank, traced on this machine without allocating them.
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:8")
    training = TrainingSpec(global_batch_size=64, seq_len=4096)
    layout = Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        zero_stage=1,
        sequence_parallel=True,
    )
    plan_path = tmp_path / "plan.json"
    save_plan(
        make_plan(model, training, cluster, "dgx-h100:8", layout, estimate(model, training, cluster, layout)), plan_path
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    traced_mib = _dry(plan_path, 63)
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert traced_mib * 2**20 > 4 * 2**30
    assert max(before, child_peak) < 2 * 2**30  # the process never held what it traced
