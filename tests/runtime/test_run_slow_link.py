"""A link slowed on purpose is named, with its two ranks and their hosts, no rank is named a
straggler, and --on-fault exit ends the job there with code 4 (slow links). One torchrun
job of 4 CPU ranks, tiny-gpt tp2 x dp2 (the fewest ranks with two groups along an axis): from
step 2, the first step the detector judges, ranks 0 and 1 sleep runtime.run.SLOW_LINK_FAULT_S
in each collective of their tp group (0, 1)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_cluster
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster
from planner.schemas import RunReport

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(180)]


def test_a_slowed_link_is_named_and_exit_ends_the_job(tmp_path: Path) -> None:
    save_cluster(cpu_cluster(4), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--dp", "2", "--tp", "2"]
    result = CliRunner().invoke(app, [*search, "--global-batch-size", "4", "--seq-len", "16", "--output", str(plan)])
    assert result.exit_code == 0, result.output
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    command += ["-m", "planner", "run", str(plan), "--steps", "24", "--report", str(tmp_path / "r.json")]
    command += ["--inject-fault", "0,2,slow-link,1", "--on-fault", "exit"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=150, check=False, cwd=tmp_path)
    assert "exitcode  : 4" in proc.stderr, proc.stderr[-3000:]  # torchrun's summary of the failed ranks
    stopped = [line for line in proc.stderr.splitlines() if line.startswith("error: stopped after step")]
    assert len(stopped) == 4, proc.stderr[-3000:]  # every rank
    host = socket.gethostname()
    named = f"slow link between rank 0 (host {host}) and rank 1 (host {host}) since step "
    assert all(named in line and "its tp group (ranks 0,1) waits" in line for line in stopped), stopped
    report = RunReport.model_validate_json((tmp_path / "r.json").read_text())
    assert report.stragglers == () and report.stopped_by_fault
    assert [(link.ranks, link.hosts, link.axis, link.siblings) for link in report.slow_links] == [
        ((0, 1), (host, host), "tp", ((2, 3),))
    ]
    at = report.slow_links[0].named_at_step
    assert 10 <= at < 23, at  # 3 windows of 3 steps from step 2: step 10, later under a busy host
    assert report.slow_links[0].since_step == at - 8
    assert len(report.step_times_s) == at + 1  # it stopped there
    assert report.link_checks >= 12  # 4 groups in 2 families, 3 windows or more
