"""--pipeline-flushes: estimate prices a step run as several pipeline schedules, the plan file
carries it, a count that does not divide the step is one line and exit 2, and the runtime runs
it (tests/runtime/test_parity.py) but with the vocabulary split over the pipeline, which it
refuses before any work."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.plans import load_plan
from planner.schemas.errors import InfeasibleConfigError
from runtime.run import check_world

BASE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "16", "--seq-len", "2048"]
BASE += ["--dp", "2", "--pp", "4", "--micro-batch-size", "1", "--format", "json"]  # 8 micro-batches a step


def test_the_option_prices_more_bubbles_and_the_plan_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, one, err = planner_main(BASE, monkeypatch)
    assert code == 0, err
    path = tmp_path / "flushes.json"
    code, two, err = planner_main([*BASE, "--pipeline-flushes", "2", "--output", str(path)], monkeypatch)
    assert code == 0, err
    bubble_s = [json.loads(out)["time_breakdown_s"]["pipeline_bubble"] for out in (one, two)]
    assert bubble_s[1] == pytest.approx(2 * bubble_s[0])
    plan = load_plan(path)
    assert plan.training.pipeline_flushes == 2
    check_world(plan, plan.cluster.world_size, cuda=True)  # the runtime runs it
    vocab = tmp_path / "vocab.json"
    split = ["--vocabulary-layout", "vocab-1", "--no-vocabulary-overlap", "--output", str(vocab)]
    code, _, err = planner_main([*BASE, "--pipeline-flushes", "2", *split], monkeypatch)
    assert code == 0, err
    with pytest.raises(InfeasibleConfigError, match="runs the vocabulary passes once a step; plan with"):
        check_world(load_plan(vocab), plan.cluster.world_size, cuda=True)


def test_flushes_that_do_not_divide_the_step_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = planner_main([*BASE, "--pipeline-flushes", "3"], monkeypatch)
    assert code == 2
    assert "3 does not divide 8" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_search_that_no_layout_can_split_so_says(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["search", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "4096"]
    code, _, err = planner_main([*args, "--pipeline-flushes", "16", "--pp", "2"], monkeypatch)
    assert code == 2
    assert "with --pipeline-flushes 16, each of a pipeline's 16 schedules needs whole micro-batches" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
