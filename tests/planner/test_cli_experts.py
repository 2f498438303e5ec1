"""Mixture-of-experts input on the command line: expert-parallel degrees that do not split the
model's experts and routing traces that do not fit it exit 2 with one line; `planner explain
--routing-trace` compares a plan's expert placement with round-robin; `planner search
--expert-replicas`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api
from planner.schemas import Layout, TrainingSpec

MODEL = "tiny-moe"  # 4 MoE layers of 4 experts, top-2
CLUSTER = "dgx-h100:2"  # 16 ranks, 8 per node
TRAINING = TrainingSpec(global_batch_size=64, seq_len=128)


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The console script as a user runs it: real exit codes and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _plan(tmp_path: Path, ep: int, name: str = "plan.json") -> Path:
    layout = Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=4,
        expert_parallel_degree=ep,
    )
    model, cluster = api.load_model(MODEL), api.load_cluster(CLUSTER)
    est = api.estimate(model, cluster, TRAINING, layout)
    path = tmp_path / name
    api.save_plan(api.make_plan(model, TRAINING, cluster, CLUSTER, layout, est), path)
    return path


def _edited(plan: Path, ep: int) -> Path:
    """The plan file with its expert-parallel degree changed by hand."""
    raw = json.loads(plan.read_text())
    raw["layout"]["expert_parallel_degree"] = ep
    edited = plan.with_name(f"ep{ep}.json")
    edited.write_text(json.dumps(raw))
    return edited


def test_estimate_refuses_an_ep_that_does_not_divide_the_experts() -> None:
    args = ["-m", MODEL, "-c", CLUSTER, "--global-batch-size", "64", "--seq-len", "128", "--dp", "16"]
    code, _, err = run(["estimate", *args, "--ep", "8"])
    one_line(code, err, "expert_parallel_degree=8 does not divide the 4 experts of 'tiny-moe'")
    assert "divides both 4 and data_parallel_degree=16: 1, 2, 4" in err


@pytest.mark.parametrize(
    "command",
    [["estimate", "--plan", "{plan}"], ["explain", "{plan}"], ["run", "{plan}", "--dry-run"], ["launch", "{plan}"]],
)
def test_a_plan_edited_to_an_ep_that_does_not_divide_the_experts_is_refused(tmp_path: Path, command: list[str]) -> None:
    edited = _edited(_plan(tmp_path, ep=4), 8)
    code, out, err = run([part.format(plan=edited) for part in command])
    one_line(code, err, f"{edited}: not a valid plan: expert_parallel_degree=8 does not divide the 4 experts")
    assert out == ""


def test_run_under_torchrun_refuses_the_edited_plan_before_any_work(tmp_path: Path) -> None:
    edited = _edited(_plan(tmp_path, ep=4), 8)
    # As each rank sees it under torchrun: the plan is read before torch and the process group.
    env = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    code, _, err = run(["run", str(edited), "--report", str(tmp_path / "r.json")], env)
    one_line(code, err, "expert_parallel_degree=8 does not divide the 4 experts")
    assert not (tmp_path / "r.json").exists()
