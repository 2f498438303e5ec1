"""A rank that freezes mid-run ends the job within --timeout on every rank: each survivor names
it and the step it froze in, and exits with code 3; the checkpoints completed before it stay
complete (no hang). One torchrun job of 4 CPU ranks with a short timeout."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_cluster
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster
from runtime import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(180)]


def test_a_frozen_rank_is_named_and_the_job_ends(tmp_path: Path) -> None:
    save_cluster(cpu_cluster(4), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json")]
    result = CliRunner().invoke(app, [*search, "--global-batch-size", "8", "--seq-len", "32", "--output", str(plan)])
    assert result.exit_code == 0, result.output
    ckpt = tmp_path / "ckpt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    command += [
        "-m",
        "planner",
        "run",
        str(plan),
        "--steps",
        "6",
        "--timeout",
        "5",
        "--report",
        str(tmp_path / "r.json"),
    ]
    command += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--inject-fault", "1,3,hang"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=150, check=False, cwd=tmp_path)
    named = [line for line in proc.stderr.splitlines() if line.startswith("error: training stopped:")]
    assert proc.returncode != 0
    assert len(named) == 3, proc.stderr[-3000:]  # every survivor
    assert all("rank 1 stopped responding in step (3)" in line for line in named), named
    assert checkpoint.latest(ckpt) == ckpt / checkpoint.checkpoint_name(3)
