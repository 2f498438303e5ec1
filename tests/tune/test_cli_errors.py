"""Bad input to `planner tune` and `planner validate`: one line, exit code 2, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

PLANNER = [sys.executable, "-m", "planner"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*PLANNER, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False)


def test_validate_of_a_missing_storage_says_so_and_creates_nothing(tmp_path: Path) -> None:
    result = _run(["validate", "--storage", "sqlite:///nowhere.db"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --storage sqlite:///nowhere.db: no such file; give the storage planner tune wrote to"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_launcher_naming_an_unknown_placeholder_is_refused_before_any_work(tmp_path: Path) -> None:
    args = ["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "32"]
    result = _run([*args, "--no-calibrate", "--launcher", "srun -N {nodes} {run_args}"], tmp_path)
    assert result.returncode == 2
    assert "--launcher names {nodes}; it may use {plan}" in result.stderr
    assert list(tmp_path.iterdir()) == []
