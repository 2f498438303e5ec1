"""Bad input to `planner tune` and `planner validate`: one line, exit code 2, nothing written
(the commands run in the test process, harness.planner_main, in the test's directory)."""

import subprocess
from pathlib import Path

import pytest
from harness import planner_main


def _run(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess[str]:
    code, out, err = planner_main(args, monkeypatch, cwd=cwd)
    return subprocess.CompletedProcess(["planner", *args], code, out, err)


def test_validate_of_a_missing_storage_says_so_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(["validate", "--storage", "sqlite:///nowhere.db"], tmp_path, monkeypatch)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --storage sqlite:///nowhere.db: no such file; give the storage planner tune wrote to"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_launcher_naming_an_unknown_placeholder_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "32"]
    result = _run([*args, "--no-calibrate", "--launcher", "srun -N {nodes} {run_args}"], tmp_path, monkeypatch)
    assert result.returncode == 2
    assert "--launcher names {nodes}; it may use {plan}" in result.stderr
    assert list(tmp_path.iterdir()) == []
