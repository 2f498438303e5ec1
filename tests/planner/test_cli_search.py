"""`planner search`, `planner explain` and `planner launch` as a user runs them."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models.estimate import estimate
from planner.cli import app
from planner.cli.plan_commands import _verify
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import load_plan, make_plan, save_plan
from planner.schemas import Layout, TrainingSpec

SEARCH = ["search", "-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"]


def test_search_prints_a_ranked_table_and_writes_the_best_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*SEARCH, "--top-k", "3", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "3 fastest layouts that fit" in result.output and "whole space" in result.output
    plan = load_plan(out)
    assert plan.runner_up is not None
    assert plan.estimate.step_time_s <= plan.runner_up.estimate.step_time_s
    assert plan.layout.world_size == 8


def test_optuna_search_stores_a_resumable_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = [*SEARCH, "--strategy", "optuna", "--trials", "20", "--storage", storage]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert (tmp_path / "study.db").exists()


def test_search_that_cannot_fit_exits_2_with_advice() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "search",
            "-m",
            "llama3-405b",
            "-c",
            "dgx-a100-80g:1",
            "--global-batch-size",
            "8",
            "--seq-len",
            "8192",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "no layout of 'llama3-405b' fits" in proc.stderr and "Traceback" not in proc.stderr


def test_explain_compares_with_the_runner_up(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert CliRunner().invoke(app, [*SEARCH, "--output", str(out)]).exit_code == 0
    result = CliRunner().invoke(app, ["explain", str(out)])
    assert result.exit_code == 0, result.output
    assert "why it beat the runner-up" in result.output and "pipeline bubble" in result.output


def test_launch_prints_one_torchrun_line_per_node(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    big = ["search", "-m", "llama3-8b", "-c", "dgx-h100:2", "--global-batch-size", "64", "--seq-len", "2048"]
    assert CliRunner().invoke(app, [*big, "--output", str(out)]).exit_code == 0
    result = CliRunner().invoke(app, ["launch", str(out), "--master-addr", "10.0.0.1", "--steps", "5"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("torchrun")]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        argv = shlex.split(line)
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--nproc-per-node") + 1] == "8"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"
        assert argv[-6:] == ["run", str(out), "--steps", "5", "--report", "report.json"]
    script = tmp_path / "launch.sh"
    assert CliRunner().invoke(app, ["launch", str(out), "--output", str(script)]).exit_code == 0
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_single_node_launch_is_standalone(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert CliRunner().invoke(app, [*SEARCH, "--output", str(out)]).exit_code == 0
    result = CliRunner().invoke(app, ["launch", str(out)])
    assert "torchrun --standalone --nproc-per-node 8 -m planner run" in result.output
    assert json.loads(out.read_text())["cluster"]["num_nodes"] == 1


def test_search_verify_dry_runs_the_first_and_last_stage(tmp_path: Path) -> None:
    args = [
        "search",
        "-m",
        "tiny-gpt",
        "-c",
        "dgx-a100-80g:1",
        "--global-batch-size",
        "16",
        "--seq-len",
        "64",
        "--top-k",
        "1",
        "--verify",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│") and "MiB" not in line]
    # the dry-run table's rows: 7 columns (rank .. seconds), the search table's 7 begin with a rank too
    traced = [line for line in rows if line.split("│")[1].strip().isdigit() and "%" not in line]
    assert traced, proc.stdout
    assert "dry run: traced peak memory beside the estimate" in proc.stdout


def test_verify_dry_runs_both_ends_of_a_pipeline_with_tied_embeddings(capsys: pytest.CaptureFixture[str]) -> None:
    # The README main job's plan kind: tiny-gpt ties its embeddings, and with a pipeline the first
    # and last stage pair up to sum the copies' gradients. --verify dry-runs exactly those two
    # stages; it once failed there reading the fake mesh tensor.
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=8, seq_len=64)
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)
    plan = make_plan(model, training, cluster, "dgx-h100:1", layout, estimate(model, training, cluster, layout))
    _verify(plan)  # raises PlannerError with the failing rank's last line
    err = capsys.readouterr().err
    assert "dry run of rank 0 " in err and "dry run of rank 4 " in err  # rank 4: stage 1's first


def _two_node_plan(tmp_path: Path) -> Path:
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:2")
    training = TrainingSpec(global_batch_size=16, seq_len=64)
    layout = Layout(data_parallel_degree=16, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    path = tmp_path / "plan.json"
    save_plan(
        make_plan(model, training, cluster, "dgx-h100:2", layout, estimate(model, training, cluster, layout)), path
    )
    return path


def _fake_torchrun(tmp_path: Path) -> dict[str, str]:
    """An environment whose `torchrun` prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


def _bash(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], capture_output=True, text=True, check=False, env=env)


def test_launch_without_master_addr_says_how_to_set_it_and_takes_it_from_the_shell(tmp_path: Path) -> None:
    # Without --master-addr the lines once read `--rdzv-endpoint MASTER_ADDR:29500`,
    # a placeholder that looks like a host name; run as printed, torchrun tried to resolve it.
    plan = _two_node_plan(tmp_path)
    result = CliRunner().invoke(app, ["launch", str(plan)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# set MASTER_ADDR to the address of node 0")
    lines = [line for line in result.output.splitlines() if line.startswith("torchrun")]
    assert len(lines) == 2 and all(" MASTER_ADDR:" not in line for line in lines)
    env = _fake_torchrun(tmp_path)
    ran = _bash(["-c", lines[1]], {**env, "MASTER_ADDR": "10.0.0.9"})
    argv = ran.stdout.splitlines()
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.9:29500" and argv[argv.index("--node-rank") + 1] == "1"
    unset = _bash(["-c", lines[1]], env)
    assert unset.returncode != 0 and unset.stdout == ""
    assert len(unset.stderr.splitlines()) == 1 and "MASTER_ADDR" in unset.stderr


def test_launch_script_needs_the_node_rank_and_the_master_address(tmp_path: Path) -> None:
    # `bash launch.sh` without a node rank once ran as node 0 on every node it was
    # started on. It now takes the rank as its argument or from NODE_RANK, and fails in one line without.
    plan, script = _two_node_plan(tmp_path), tmp_path / "launch.sh"
    assert CliRunner().invoke(app, ["launch", str(plan), "--output", str(script)]).exit_code == 0
    env = _fake_torchrun(tmp_path)
    for args, extra in (([], {"MASTER_ADDR": "h"}), (["2"], {"MASTER_ADDR": "h"}), (["1"], {})):
        refused = _bash([str(script), *args], {**env, **extra})
        assert refused.returncode == 2 and refused.stdout == "", (args, extra)
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "NODE_RANK" in _bash([str(script)], {**env, "MASTER_ADDR": "h"}).stderr
    for args, extra in ((["1"], {}), ([], {"NODE_RANK": "1"})):
        ran = _bash([str(script), *args], {**env, "MASTER_ADDR": "10.0.0.9", **extra})
        assert ran.returncode == 0, ran.stderr
        argv = ran.stdout.splitlines()
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.9:29500"
