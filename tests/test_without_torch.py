"""Planning runs where torch is not installed; the commands that need it say which extra brings it.

The commands run in a fresh interpreter whose ``sitecustomize`` (``tests/no_torch``) makes torch
unimportable and logs every attempt, so a planning command passes only if it never tried torch,
not if it tried and swallowed the ImportError. They run through the console script's ``main``,
several in one interpreter (``tests/no_torch/run_cli.py``), to pay the start-up once.
``test_torchless_venv.py`` checks the same on a real install without torch.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_TORCH = Path(__file__).resolve().parent / "no_torch"
SEARCH = ["--model", "tiny-gpt", "--cluster", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "256"]
EXTRA = "pip install 'planner[runtime]'"

PLANNING = {
    "search": ["search", *SEARCH, "--output", "plan.json"],
    "estimate": ["estimate", *SEARCH, "--plan", "plan.json", "--format", "json"],
    "explain": ["explain", "plan.json", "--plot", "plots"],
    "export torchtitan": ["export", "plan.json", "--to", "torchtitan"],
    "export megatron": ["export", "plan.json", "--to", "megatron"],
    "export deepspeed": ["export", "plan.json", "--to", "deepspeed"],
    "launch": ["launch", "plan.json"],
    "presets": ["presets"],
    "replan": ["replan", "plan.json", "--cluster", "dgx-a100-80g:1", "--output", "replanned.json"],
}
"""The commands that plan, in an order where each finds the files the earlier ones wrote."""

NEED_TORCH = {
    "planner run": ["run", "plan.json"],
    "planner run --dry-run": ["run", "plan.json", "--dry-run"],
    "planner profile": ["profile", "--output", "cluster.json"],
    "planner tune": ["tune", *SEARCH, "--save-calibration", "calibrated.json"],
    "planner replan --checkpoint-dir": ["replan", "plan.json", "--cluster", "dgx-h100:1", "--checkpoint-dir", "."],
    "planner launch --run": ["launch", "plan.json", "--run"],
}
"""The commands that need torch, by the name their error gives them."""


def _without_torch(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``python argv`` in ``cwd`` with torch unimportable: its result and the torch modules it tried."""
    log = cwd / "torch-imports.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_TORCH), str(ROOT)]), "NO_TORCH_LOG": str(log)}
    out = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    tried = log.read_text().split() if log.exists() else []
    return out, tried


def _run_cli(commands: list[list[str]], cwd: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Each command line's exit code and stderr, and the torch modules the commands tried."""
    results = cwd / "results.json"
    out, tried = _without_torch([str(NO_TORCH / "run_cli.py"), str(results), *map(json.dumps, commands)], cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    ran: list[dict[str, Any]] = json.loads(results.read_text())
    return ran, tried


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with plan.json in it, written by `planner search` without torch."""
    folder = tmp_path_factory.mktemp("no-torch")
    ran, tried = _run_cli([PLANNING["search"]], folder)
    assert ran[0]["code"] == 0, ran[0]["stderr"]
    assert tried == []
    return folder


def test_the_blocker_blocks(tmp_path: Path) -> None:
    out, tried = _without_torch(["-c", "import torch"], tmp_path)
    assert out.returncode == 1
    assert "ModuleNotFoundError: No module named 'torch'" in out.stderr
    assert tried == ["torch"]


def test_planning_commands_never_import_torch(folder: Path) -> None:
    ran, tried = _run_cli(list(PLANNING.values()), folder)
    assert {name: r["stderr"] for name, r in zip(PLANNING, ran, strict=True) if r["code"] != 0} == {}
    assert tried == []
    assert (folder / "replanned.json").is_file()
    assert sorted(p.name for p in (folder / "plots").iterdir())


def test_the_python_api_plans_without_torch(tmp_path: Path) -> None:
    code = """
import planner
from planner.schemas import TrainingSpec
plans = planner.search("tiny-gpt", "dgx-h100:1", TrainingSpec(global_batch_size=8, seq_len=256))
estimate = planner.estimate("tiny-gpt", "dgx-h100:1", plans[0].training, plans[0].layout)
assert estimate.step_time_s > 0
planner.explain(plans[0], timeline=True)
assert "--tensor-model-parallel-size" in planner.api.export(plans[0], "megatron")
"""
    out, tried = _without_torch(["-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    assert tried == []


def test_commands_that_need_torch_name_the_extra_and_exit_2(folder: Path) -> None:
    """`tune` and `replan` open a progress display first: their error is the last line of stderr."""
    ran, _ = _run_cli(list(NEED_TORCH.values()), folder)
    for command, result in zip(NEED_TORCH, ran, strict=True):
        lines = result["stderr"].strip().splitlines()
        assert (result["code"], lines[-1:]) == (2, [f"error: {command} needs torch: {EXTRA}"]), result
        if command in ("planner run", "planner run --dry-run", "planner profile", "planner launch --run"):
            assert len(lines) == 1, result
