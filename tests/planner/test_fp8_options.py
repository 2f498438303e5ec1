"""--fp8 on the plan commands: what a user who trains in FP8 types, priced, recorded in the plan,
and each input that cannot run refused in one line with exit code 2 and the fix."""

import json
import re
from pathlib import Path

import pytest
from harness import planner_main

BASE = ["-m", "llama3-8b", "--global-batch-size", "16", "--seq-len", "8192"]
LAYOUT = ["--dp", "8", "--micro-batch-size", "2", "--zero-stage", "3"]


def _estimate(monkeypatch: pytest.MonkeyPatch, *extra: str, cluster: str = "dgx-h100:1") -> tuple[int, str, str]:
    return planner_main(["estimate", *BASE, "-c", cluster, *LAYOUT, "--format", "json", *extra], monkeypatch)


def test_an_fp8_recipe_is_priced_faster_than_bf16_and_recorded_in_the_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, _ = _estimate(monkeypatch, "--stack", "torchtitan")
    assert code == 0
    bf16 = json.loads(out)["step_time_s"]
    plan = tmp_path / "plan.json"
    code, out, _ = _estimate(monkeypatch, "--stack", "torchtitan", "--fp8", "tensorwise", "--output", str(plan))
    assert code == 0
    fp8 = json.loads(out)["step_time_s"]
    assert 1.1 < bf16 / fp8 < 1.6
    training = json.loads(plan.read_text())["training"]
    assert (training["fp8"], training["fp8_param_gather"]) == ("tensorwise", False)
    # the plan prices again as it was written
    code, out, _ = planner_main(["estimate", "--plan", str(plan), "--format", "json"], monkeypatch)
    assert code == 0 and json.loads(out)["step_time_s"] == pytest.approx(fp8, rel=1e-9)


@pytest.mark.parametrize(
    ("extra", "cluster", "says"),
    [
        (["--stack", "torchtitan", "--fp8", "tensorwise"], "dgx-a100-80g:1", "needs FP8 tensor cores"),
        (["--stack", "megatron-lm", "--fp8", "mxfp8"], "dgx-h100:1", "give a per-tensor recipe instead"),
        (["--stack", "torchtitan", "--fp8", "mxfp8"], "dgx-a100-80g:1", "train in bf16 on it (drop --fp8)"),  # no FP8
        (["--stack", "torchtitan", "--fp8", "rowwise", "--fp8-param-gather"], "dgx-h100:1", "drop --fp8-param-gather"),
        (["--stack", "torchtitan", "--fp8", "tensorwise", "--dtype", "fp32"], "dgx-h100:1", "give --dtype bf16"),
        (["--stack", "megatron-lm", "--fp8", "rowwise"], "dgx-h100:1", "offers delayed, tensorwise, blockwise"),
        (["--stack", "deepspeed", "--fp8", "tensorwise"], "dgx-h100:1", "does not train in FP8"),
        (["--stack", "torchtitan", "--fp8-param-gather"], "dgx-h100:1", "give --fp8 RECIPE"),
    ],
)
def test_fp8_that_cannot_run_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, extra: list[str], cluster: str, says: str
) -> None:
    code, out, err = _estimate(monkeypatch, *extra, cluster=cluster)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_search_plans_in_the_recipe_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = planner_main(
        [
            "search", *BASE, "-c", "dgx-h100:1", "--stack", "megatron-lm", "--fp8", "delayed",
            "--fp8-param-gather", "--top-k", "1", "--output", str(plan),
        ],
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    training = json.loads(plan.read_text())["training"]
    assert (training["fp8"], training["fp8_param_gather"]) == ("delayed", True)


def test_search_compares_the_recipes_the_user_allows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def search(recipes: str, plan: Path, *extra: str) -> tuple[int, int]:
        code, out, err = planner_main(
            ["search", *BASE, "-c", "dgx-h100:1", "--stack", "torchtitan", "--fp8", recipes, *extra,
             "--output", str(plan)],
            monkeypatch,
        )  # fmt: skip
        assert code == 0, err
        evaluated = re.search(r"([\d,]+) evaluated of ([\d,]+) candidates", out)
        assert evaluated is not None, out
        return int(evaluated[1].replace(",", "")), int(evaluated[2].replace(",", ""))

    both = search("none,tensorwise", tmp_path / "both.json", "--fp8-param-gather")  # tensorwise's only
    alone = search("none", tmp_path / "bf16.json")
    # each recipe's space searched (what it prunes differs: FP8 holds other memory), ranked together
    assert both[1] == 2 * alone[1] and both[0] > alone[0]
    best = json.loads((tmp_path / "both.json").read_text())["training"]
    assert (best["fp8"], best["fp8_param_gather"]) == ("tensorwise", True)  # faster than bf16 at this size
    assert json.loads((tmp_path / "bf16.json").read_text())["training"]["fp8"] is None


def test_an_unknown_recipe_in_the_list_is_refused_with_the_names(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = planner_main(
        ["search", *BASE, "-c", "dgx-h100:1", "--stack", "torchtitan", "--fp8", "none,tensorwize"], monkeypatch
    )
    assert code == 2 and out == ""
    assert "'tensorwize' is not an FP8 recipe" in err and "none, delayed, tensorwise" in err
