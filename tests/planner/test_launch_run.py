"""planner launch PLAN --run: the node's torchrun line runs in this process through torch's
launcher; a clean error the ranks report ends the job with that error once and the ranks' exit
code, never torchrun's ChildFailedError traceback; what can be checked before a rank starts is."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cpu_cluster
from harness import planner_main

from cost_models.estimate import estimate
from planner import api
from planner.export.torchrun import torchrun_commands
from planner.files.cluster_presets import cluster_preset
from planner.files.clusters import save_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.flows.launch_run import RankFailure, job_outcome
from planner.schemas import Layout, TrainingSpec

MESSAGE = "--resume continues from a checkpoint: give its folder with --checkpoint-dir"


def _plan(folder: Path, nodes: int = 1) -> Path:
    """tiny-gpt on 2 CPU ranks, or data-parallel over the GPUs of ``nodes`` DGX H100 nodes."""
    if nodes == 1:
        cluster, spec = cpu_cluster(2), str(folder / "cluster.json")
        save_cluster(cluster, folder / "cluster.json")
    else:
        cluster, spec = cluster_preset("dgx-h100", nodes), f"dgx-h100:{nodes}"
    model, training = load_model("tiny-gpt"), TrainingSpec(global_batch_size=32, seq_len=32)
    dp = cluster.world_size
    layout = Layout(data_parallel_degree=dp, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    plan = make_plan(model, training, cluster, spec, layout, estimate(model, training, cluster, layout))
    save_plan(plan, folder / "plan.json")
    return folder / "plan.json"


def test_the_ranks_errors_are_said_once_with_their_code() -> None:
    # Rank 1 wrote the same error, then the launcher stopped it (SIGTERM) once rank 0 had exited 2.
    said = {0: RankFailure(0, 2, MESSAGE), 1: RankFailure(1, -15, MESSAGE)}
    assert job_outcome(said) == (2, [f"error: {MESSAGE}"])
    # A crashed rank (no error file) beside a survivor's diagnosis: both said, codes differ -> 1.
    crash = {0: RankFailure(0, 3, "training stopped: rank 1 stopped responding"), 1: RankFailure(1, 1, "")}
    assert job_outcome(crash) == (
        1,
        ["error: training stopped: rank 1 stopped responding", "error: rank 1 exited with code 1"],
    )
    # Only signals: each said, exit 1.
    assert job_outcome({0: RankFailure(0, -9, "Signal 9 (SIGKILL)")}) == (1, ["error: Signal 9 (SIGKILL)"])


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--output", "launch.sh"], "--output launch.sh writes the lines for later and --run runs them now"),
        (["--report", "missing/r.json"], "--report 'missing/r.json': the folder 'missing' does not exist"),
    ],
)
def test_what_launch_run_can_check_is_refused_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], said: str
) -> None:
    plan = _plan(tmp_path)
    code, _, err = planner_main(["launch", str(plan), "--run", *extra], monkeypatch, cwd=tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {said}"), err


def test_a_plan_of_several_nodes_needs_the_node_and_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, nodes=2)
    code, _, err = planner_main(["launch", str(plan), "--run"], monkeypatch, cwd=tmp_path)
    assert code == 2 and "the plan runs on 2 nodes and no --node-rank says which this is" in err
    code, _, err = planner_main(["launch", str(plan), "--run", "--node-rank", "1"], monkeypatch, cwd=tmp_path)
    assert code == 2 and "needs --master-addr HOST" in err


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_launch_run_trains_and_a_ranks_error_ends_the_job_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "planner", "launch", str(plan), "--run", "--steps", "2", "--report", "r.json"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "r.json").is_file() and "step 2/2" in done.stderr
    # Every rank refuses --resume without --checkpoint-dir: exit 2, the error once, no traceback.
    (command,) = torchrun_commands(api.load_plan(plan), str(plan), steps=2, report_path=str(tmp_path / "r.json"))
    code, lines = api.run_node(replace(command, argv=(*command.argv, "--resume")))
    assert (code, lines) == (2, [f"error: {MESSAGE}"])
