"""`planner launch` prints a command that, run as printed, trains the plan and writes the report;
a plan that does not match its job is refused before any work."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.inputs import save_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]


def _local_plan(tmp_path: Path, ranks: int = 4) -> Path:
    """A plan of tiny-gpt for a one-node CPU cluster of ``ranks`` ranks."""
    save_cluster(cpu_cluster(ranks), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    args = [
        "search",
        "-m",
        "tiny-gpt",
        "-c",
        str(tmp_path / "cluster.json"),
        "--global-batch-size",
        "8",
        "--seq-len",
        "32",
        "--output",
        str(plan),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return plan


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_printed_launch_command_runs_the_plan(tmp_path: Path) -> None:
    plan = _local_plan(tmp_path)
    printed = CliRunner().invoke(app, ["launch", str(plan), "--steps", "3", "--report", str(tmp_path / "r.json")])
    (line,) = [x for x in printed.output.splitlines() if "torchrun" in x]
    proc = subprocess.run(
        line, shell=True, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["world_size"] == 4 and report["steps"] == 3 and len(report["losses"]) == 3
    assert report["measured_step_time_s"] > 0 and report["predicted_step_time_s"] > 0
    assert len(report["memory"]) == 4 and all(m["peak_bytes"] > 0 for m in report["memory"])
    assert "step time   measured" in proc.stderr
    assert shlex.split(line)[0].endswith("torchrun") or "torchrun" in line


def test_a_plan_for_another_world_size_is_refused(tmp_path: Path) -> None:
    plan = _local_plan(tmp_path, ranks=4)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "planner",
        "run",
        str(plan),
        "--steps",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "the plan is for 4 ranks" in proc.stderr and "this job has 2" in proc.stderr


def test_run_outside_torchrun_says_how_to_launch(tmp_path: Path) -> None:
    plan = _local_plan(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "run", str(plan)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "planner launch" in proc.stderr and "Traceback" not in proc.stderr
