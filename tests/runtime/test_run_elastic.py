"""An elastic job that loses a rank continues on the ranks left: 4 CPU ranks train
with --elastic and a checkpoint each step, rank 3 dies at the start of step 3; the same command
started again on 3 ranks (what torchrun's restart with fewer nodes is to the run: another world
on the same checkpoint folder) re-plans for them, resumes the step-3 checkpoint resharded and
continues the uninterrupted 4-rank run's loss curve. That curve is the plan's Trainer stepped on 4
ranks forked from the test process (tests/harness.py), not a third torchrun job: the same
layout, optimizer, seed and batches as ``planner run``, so the same losses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cpu_cluster
from harness import run_ranks
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster
from planner.files.plans import load_plan
from planner.schemas import Plan
from runtime import checkpoint
from runtime.data import synthetic_batch
from runtime.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(240)]

STEPS, FAULT_STEP, LR = 5, 3, 0.01


def _torchrun(ranks: int, plan: Path, report: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command += ["-m", "planner", "run", str(plan), "--steps", str(STEPS), "--lr", str(LR), "--timeout", "20"]
    command += ["--report", str(report), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False, cwd=plan.parent)


def _uninterrupted_losses(plan: Plan) -> list[float]:
    """The losses of ``planner run``'s ``STEPS`` steps of ``plan`` (its default seed and optimizer),
    without a fault (runs on every rank)."""
    training = plan.training
    trainer = Trainer(
        plan.model,
        plan.layout,
        global_batch_size=training.global_batch_size,
        seed=0,
        optimizer="adamw",
        lr=LR,
        device=torch.device("cpu"),
        dtype=training.dtype,
    )
    batches = (
        synthetic_batch(plan.model.vocab_size, training.global_batch_size, training.seq_len, step=step, seed=0)
        for step in range(STEPS)
    )
    return [trainer.step(inputs, targets) for inputs, targets in batches]


def test_a_job_that_loses_a_rank_replans_and_continues_the_loss_curve(tmp_path: Path) -> None:
    save_cluster(cpu_cluster(4), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--dtype", "fp32"]
    result = CliRunner().invoke(app, [*search, "--global-batch-size", "12", "--seq-len", "32", "--output", str(plan)])
    assert result.exit_code == 0, result.output
    whole = run_ranks(4, _uninterrupted_losses, load_plan(plan), workdir=tmp_path / "reference")

    ckpt = tmp_path / "ckpt"
    elastic = ("--elastic", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1")
    fault = ("--inject-fault", f"3,{FAULT_STEP},exit")
    failed = _torchrun(4, plan, tmp_path / "resumed.json", *elastic, *fault)
    assert failed.returncode != 0, failed.stderr[-3000:]
    assert checkpoint.latest(ckpt) == ckpt / checkpoint.checkpoint_name(FAULT_STEP)

    resumed = _torchrun(3, plan, tmp_path / "resumed.json", *elastic, *fault)  # the same command, 3 ranks
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "re-planned for 3 ranks (was 4)" in resumed.stderr
    assert "throughput loss" in resumed.stderr
    new_plan = load_plan(ckpt / "plans" / "world-3.json")
    assert new_plan.layout.world_size == 3
    report = json.loads((tmp_path / "resumed.json").read_text())
    assert (report["world_size"], report["first_step"], len(report["losses"])) == (3, FAULT_STEP, STEPS - FAULT_STEP)
    assert report["losses"] == pytest.approx(whole[FAULT_STEP:], abs=1e-5)  # fp32 resharding's tolerance
    assert report["losses"][0] != pytest.approx(whole[0], abs=1e-3)  # it did not start afresh
