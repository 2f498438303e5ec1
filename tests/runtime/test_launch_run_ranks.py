"""`planner launch --run` runs a plan on its ranks (2 gloo ranks here) and ends the job with
exit code 0; a user error every rank finds ends it with one line on stderr and exit code 2, no
traceback of torchrun's or the ranks'. Each test is one real launch (seconds of start-up): the
refusals before any rank starts are in tests/planner/test_launch_run.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan of tiny-gpt (vocabulary of 1024) for a one-node CPU cluster of 2 ranks."""
    tmp_path = tmp_path_factory.mktemp("launch_run")
    save_cluster(cpu_cluster(2), tmp_path / "cluster.json")
    args = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--global-batch-size", "8"]
    result = CliRunner().invoke(app, [*args, "--seq-len", "32", "--output", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    return tmp_path / "plan.json"


def _launch(plan: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``planner launch PLAN --run ARGS`` in a fresh process, in the plan's folder."""
    return subprocess.run(
        [sys.executable, "-m", "planner", "launch", str(plan), "--run", *args],
        capture_output=True,
        text=True,
        cwd=plan.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=240,
        check=False,
    )


def test_launch_run_trains_the_plan_and_exits_0(plan: Path) -> None:
    proc = _launch(plan, "--steps", "2", "--report", "report.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((plan.parent / "report.json").read_text())
    assert report["world_size"] == 2 and report["steps"] == 2 and len(report["losses"]) == 2
    assert "step time   measured" in proc.stderr and "Traceback" not in proc.stderr


def test_a_user_error_of_every_rank_is_one_line_and_exit_code_2(plan: Path) -> None:
    # Token ids past the vocabulary are found on the ranks, as they read the data (after the
    # process group is up): every rank reads the same windows and raises the same error.
    np.full(4096, 4000, dtype=np.uint16).tofile(plan.parent / "tokens.bin")
    proc = _launch(plan, "--steps", "2", "--data", "tokens.bin")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "error: --data 'tokens.bin' holds token id 4000, outside the model's vocabulary of 1024; tokenize the "
        "data with the model's tokenizer"
    ], proc.stderr  # one line: no rank's own, no torchrun traceback
