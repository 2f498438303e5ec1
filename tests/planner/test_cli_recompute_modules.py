"""--recompute-modules: estimate prices selective recompute of the named modules and the plan
file carries them; search tries them alone; bad values are one line and exit 2."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.plans import load_plan
from planner.schemas import Recompute, RecomputeModule

BASE = ["estimate", "-m", "tiny-moe", "-c", "dgx-h100:1", "--global-batch-size", "16", "--seq-len", "256"]
BASE += ["--dp", "8", "--micro-batch-size", "2", "--format", "json"]


def test_the_modules_imply_selective_and_reach_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    code, out, err = planner_main([*BASE, "--recompute-modules", "moe,layernorm", "--output", str(path)], monkeypatch)
    assert code == 0, err
    layout = load_plan(path).layout
    assert layout.recompute is Recompute.SELECTIVE
    assert layout.recompute_modules == (RecomputeModule.LAYERNORM, RecomputeModule.MOE)
    code, default, err = planner_main([*BASE, "--recompute", "selective"], monkeypatch)
    assert code == 0, err
    # the whole MoE block is rebuilt: less activation memory, more recompute time than the core alone
    modules, core = json.loads(out), json.loads(default)
    assert modules["memory_breakdown_bytes"]["activations"] < core["memory_breakdown_bytes"]["activations"]
    assert modules["time_breakdown_s"]["recompute"] > core["time_breakdown_s"]["recompute"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recompute-modules", "layernorm,attn"], "'attn' is not one of core_attn, layernorm, moe_act, mlp, moe"),
        (["--recompute-modules", ","], "names no module"),
        (["--recompute", "full", "--recompute-modules", "moe"], "but --recompute is full"),
        (["--recompute-modules", "mlp"], "recompute module mlp recomputes dense layers, but 'tiny-moe' has none"),
    ],
)
def test_bad_modules_are_one_line_and_exit_2(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = planner_main([*BASE, *args], monkeypatch)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


SEARCH = ["search", "-m", "tiny-moe", "-c", "dgx-h100:1", "--global-batch-size", "16", "--seq-len", "256"]
SEARCH += ["--tp", "1", "--pp", "1", "--micro-batch-size", "2", "--zero-stage", "0", "--recompute", "selective"]


def test_search_tries_the_given_modules_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    code, _, err = planner_main(
        [*SEARCH, "--recompute-modules", "layernorm,moe_act", "--stack", "megatron-lm", "--output", str(path)],
        monkeypatch,
    )
    assert code == 0, err
    assert load_plan(path).layout.recompute_modules == (RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT)
    code, _, err = planner_main([*SEARCH, "--recompute", "none", "--recompute-modules", "moe"], monkeypatch)
    assert code == 2
    assert "--recompute leaves selective out" in err
