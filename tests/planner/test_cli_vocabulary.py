"""The vocabulary layout on the command line: `planner estimate --vocabulary-layout`, `planner
search --vocabulary-layout` (repeatable), and `planner explain`'s per-stage view of the chosen
layout against the other."""

import json
from pathlib import Path

import pytest
from harness import planner_main
from typer.testing import CliRunner

from planner.cli import app

BASE = ["-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "64", "--seq-len", "4096"]


def _invoke(args: list[str]) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_estimate_and_explain_a_vocabulary_split_over_the_pipeline(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    _invoke(["estimate", *BASE, "--pp", "8", "--vocabulary-layout", "vocab-2", "--output", str(plan)])
    assert json.loads(plan.read_text())["layout"]["vocabulary_layout"] == "vocab-2"
    out = _invoke(["explain", str(plan)])
    assert "vocabulary layers: vocab-2 (chosen) against pinned" in out
    rows = [line for line in out.splitlines() if line.startswith("│     7 │")]
    # the pinned last stage carries the whole output layer and loss: slower and fuller
    cells = [c.strip() for c in rows[-1].split("│")[1:-1]]
    assert float(cells[3]) > float(cells[2]) and float(cells[5]) > float(cells[4])


def test_a_vocabulary_split_without_a_pipeline_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = planner_main(["estimate", *BASE, "--vocabulary-layout", "vocab-1"], monkeypatch)
    assert code == 2 and "needs pipeline_parallel_degree >= 2" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_search_keeps_to_the_vocabulary_layouts_it_is_given() -> None:
    args = ["search", "-m", "llama3-70b", "-c", "dgx-h100:4", "--global-batch-size", "256", "--seq-len", "4096"]
    args += ["--vocabulary-overlap"]  # as the paper's schedule runs the split: it wins here
    args += ["--stack", "megatron-bridge"]  # a stack the search does not check: the runtime runs no overlap
    pinned = _invoke([*args, "--vocabulary-layout", "pinned"])
    assert "vocab-2" not in pinned
    both = _invoke([*args, "--vocabulary-layout", "pinned", "--vocabulary-layout", "vocab-2"])
    assert "vocab-2" in both
