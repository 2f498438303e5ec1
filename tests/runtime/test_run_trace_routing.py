"""`planner run --trace-routing FILE` writes the routing trace of a mixture-of-experts run in the
format the placement search reads: expert ids (tokens, MoE layers, k), the expert count, the
model's name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.api import expert_traffic
from planner.cli import app
from planner.files.clusters import save_cluster
from planner.schemas import RunReport

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]

STEPS, BATCH, SEQ = 2, 8, 16


@pytest.fixture(scope="module")
def moe_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan of tiny-moe for a one-node CPU cluster of 4 ranks: dp 4, two expert-parallel
    groups of 2 ranks."""
    tmp_path = tmp_path_factory.mktemp("moe_plan")
    save_cluster(cpu_cluster(4), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    args = ["estimate", "-m", "tiny-moe", "-c", str(tmp_path / "cluster.json"), "--output", str(plan)]
    args += ["--global-batch-size", str(BATCH), "--seq-len", str(SEQ), "--dp", "4", "--ep", "2"]
    made = CliRunner().invoke(app, args)
    assert made.exit_code == 0, made.output
    return plan


def test_a_dry_run_of_a_mixture_of_experts_routes_evenly(moe_plan: Path) -> None:
    # Fake tensors have no values to route by: the dry run gives every expert its even share of
    # the routed pairs (the cost model's balanced routing) and traces the exchanges as they run.
    for rank in (0, 3):
        cmd = [sys.executable, "-m", "planner", "run", str(moe_plan), "--dry-run", "--rank", str(rank)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "200"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (row,) = [line for line in proc.stdout.splitlines() if line.startswith("│")]
        assert float(row.split("│")[3].replace(",", "")) > 0


def test_planner_run_writes_every_tokens_experts(moe_plan: Path, tmp_path: Path) -> None:
    plan = moe_plan
    trace = tmp_path / "trace.npz"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "planner"]
    cmd += ["run", str(plan), "--steps", str(STEPS), "--report", str(tmp_path / "r.json")]
    cmd += ["--trace-routing", str(trace)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layout = json.loads(plan.read_text())["layout"]
    with np.load(trace) as f:
        ids, experts, model = f["expert_ids"], int(f["num_experts"]), str(f["model"])
    assert (model, experts) == ("tiny-moe", 4), layout
    assert ids.shape == (STEPS * BATCH * SEQ, 4, 2) and ids.dtype == np.int64, layout
    assert ids.min() >= 0 and ids.max() < experts
    assert (ids[:, :, 0] != ids[:, :, 1]).all()  # top-2: two different experts per token and layer
    # The bytes the all-to-alls sent to other ranks, against the cost model's for the captured trace.
    report = RunReport.model_validate_json((tmp_path / "r.json").read_text())
    measured = sum(report.expert_sent_bytes_per_step) / 4
    (predicted,) = expert_traffic(plan, trace)
    assert len(report.expert_sent_bytes_per_step) == 4 and measured == pytest.approx(predicted, rel=0.10)
    assert "all-to-all  measured" in proc.stderr and "(the captured routing)" in proc.stderr, proc.stderr
