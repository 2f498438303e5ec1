"""`planner launch` prints a command that, run as printed, trains the plan and writes the report,
and the dry run of the plan agrees with that run's tracked peak; a plan that does not match its
job is refused before any work.

The job the printed command starts (torchrun, 4 ranks: seconds of start-up) is launched once for
the module (``launched``); the refusals run ``planner`` in the test process (they refuse before
torchrun would matter: the launcher's environment is all they read)."""

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import planner_main
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster

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


@dataclass(frozen=True)
class Launched:
    """The plan, the command line `planner launch` printed for it, and that command's run."""

    plan: Path
    line: str
    proc: subprocess.CompletedProcess[str]
    report: Path


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """The command `planner launch` prints for a 4-rank plan, run as printed (3 steps)."""
    tmp_path = tmp_path_factory.mktemp("launched")
    plan = _local_plan(tmp_path)
    printed = CliRunner().invoke(app, ["launch", str(plan), "--steps", "3", "--report", str(tmp_path / "r.json")])
    (line,) = [x for x in printed.output.splitlines() if "torchrun" in x]
    proc = subprocess.run(
        line, shell=True, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=240, check=False
    )
    return Launched(plan, line, proc, tmp_path / "r.json")


def test_the_printed_launch_command_runs_the_plan(launched: Launched) -> None:
    proc = launched.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(launched.report.read_text())
    assert report["world_size"] == 4 and report["steps"] == 3 and len(report["losses"]) == 3
    assert report["measured_step_time_s"] > 0 and report["predicted_step_time_s"] > 0
    assert len(report["memory"]) == 4 and all(m["peak_bytes"] > 0 for m in report["memory"])
    assert "step time   measured" in proc.stderr
    assert shlex.split(launched.line)[0].endswith("torchrun") or "torchrun" in launched.line


def test_dry_run_matches_the_real_runs_tracked_peak(launched: Launched) -> None:
    # The dry run traces the real runtime under fake tensors (tests/runtime/test_dry_run.py): its
    # peak is the real run's, tracked by the same method.
    assert launched.proc.returncode == 0, launched.proc.stdout + launched.proc.stderr
    measured = {m["rank"]: m for m in json.loads(launched.report.read_text())["memory"]}
    assert measured[0]["method"] == "MemTracker"
    assert _dry(launched.plan, 0) == pytest.approx(measured[0]["peak_bytes"] / 2**20, rel=0.05)


def _torchrun_env(monkeypatch: pytest.MonkeyPatch, *, rank: int, world: int) -> None:
    """The environment torchrun gives rank ``rank`` of a one-node job of ``world`` ranks."""
    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # no rendezvous: a run that got that far fails at once
        monkeypatch.delenv(name, raising=False)


def test_a_plan_for_another_world_size_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _local_plan(tmp_path, ranks=4)
    for rank in (0, 1):  # every rank of a 2-rank job refuses
        _torchrun_env(monkeypatch, rank=rank, world=2)
        code, _, err = planner_main(["run", str(plan), "--steps", "1"], monkeypatch)
        assert code == 2, err
        assert "the plan is for 4 ranks" in err and "this job has 2" in err and "Traceback" not in err


def test_run_outside_torchrun_says_how_to_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _local_plan(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = planner_main(["run", str(plan)], monkeypatch)
    assert code == 2 and "planner launch" in err and "Traceback" not in err
