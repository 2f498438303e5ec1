"""--stack on the commands that price, `planner stacks`, and exports that price a plan as their
target runs it: a plan searched for one framework and exported to another says what changes."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.plans import load_plan
from planner.schemas import Kernels, StackName

ESTIMATE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:2", "--global-batch-size", "64", "--seq-len", "4096"]
ESTIMATE += ["--dp", "2", "--tp", "2", "--pp", "4", "--micro-batch-size", "1", "--zero-stage", "1"]
ESTIMATE += ["--schedule", "interleaved", "--virtual-stages", "2", "--sequence-parallel", "--format", "json"]


def _estimate(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    code, out, err = planner_main([*ESTIMATE, *args], monkeypatch)
    assert code == 0, err
    return dict(json.loads(out))


def test_estimate_prices_each_stacks_way_of_running_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _estimate([], monkeypatch)
    megatron = _estimate(["--stack", "megatron-lm"], monkeypatch)
    # Megatron-LM frees each pipeline receive buffer after its transfer and fuses its kernels
    assert megatron["peak_memory_bytes"] < runtime["peak_memory_bytes"]
    assert megatron["time_breakdown_s"]["compute"] < runtime["time_breakdown_s"]["compute"]  # type: ignore[index]
    # a flag changes one behaviour of the stack: megatron-lm's buffers per micro-batch are the runtime's memory
    kept = _estimate(["--stack", "megatron-lm", "--pipeline-buffers", "per-micro-batch"], monkeypatch)
    assert kept["peak_memory_bytes"] > megatron["peak_memory_bytes"]
    assert _estimate(["--stack", "planner-runtime"], monkeypatch) == runtime


def test_a_plan_records_its_stack_and_overrides_and_explain_prints_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plan.json"
    code, _, err = planner_main(
        [*ESTIMATE, "--stack", "megatron-lm", "--kernels", "eager", "--output", str(path)], monkeypatch
    )
    assert code == 0, err
    training = load_plan(path).training
    assert training.stack is StackName.MEGATRON_LM
    assert training.overrides == {"kernels": Kernels.EAGER}
    code, out, err = planner_main(["explain", str(path)], monkeypatch)
    assert code == 0, err
    assert "megatron-lm (kernels=eager)" in out


def test_estimate_over_a_plan_moves_it_to_another_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    code, _, err = planner_main([*ESTIMATE, "--output", str(path)], monkeypatch)
    assert code == 0, err
    code, out, err = planner_main(
        ["estimate", "--plan", str(path), "--stack", "megatron-lm", "--format", "json"], monkeypatch
    )
    assert code == 0, err
    assert json.loads(out) == _estimate(["--stack", "megatron-lm"], monkeypatch)


def test_stacks_lists_every_stack_and_shows_one_with_its_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = planner_main(["stacks"], monkeypatch)
    assert code == 0, err
    for name in StackName:
        assert str(name) in out
    code, out, err = planner_main(["stacks", "megatron-lm"], monkeypatch)
    assert code == 0, err
    assert "--cross-entropy-loss-fusion" in out and "per-transfer" in out
    code, _, err = planner_main(["stacks", "nemo"], monkeypatch)
    assert code == 2 and "nemo" in err


def test_tune_refuses_another_stack_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "128"]
    code, _, err = planner_main([*args, "--stack", "torchtitan"], monkeypatch)
    assert code == 2
    assert "tune runs the plans on this planner's runtime" in err and "Traceback" not in err


def _search(stack: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["search", "-m", "gpt3-175b", "-c", "dgx-a100-80g:128", "--global-batch-size", "1536", "--seq-len", "2048"]
    code, _, err = planner_main([*args, "--stack", stack, "--top-k", "1", "--output", str(path)], monkeypatch)
    assert code == 0, err


@pytest.mark.slow
def test_an_export_says_what_its_targets_stack_changes_and_nothing_when_planned_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPT-3 175B on 128 DGX A100s: the plan searched for the planner's runtime keeps a receive
    buffer per micro-batch that Megatron-LM does not; searched for megatron-lm, nothing changes."""
    runtime, megatron = tmp_path / "runtime.json", tmp_path / "megatron.json"
    _search("planner-runtime", runtime, monkeypatch)
    code, out, err = planner_main(["export", str(runtime), "--to", "megatron"], monkeypatch)
    assert code == 0, err
    assert out.startswith("--tensor-model-parallel-size") and "#" not in out  # the arguments alone on stdout
    assert err.startswith("Megatron-LM core_v0.15.0 arguments")  # what they come from, beside them
    assert "priced for planner-runtime" in err and "as megatron-lm runs it" in err and "GiB less a rank" in err
    _search("megatron-lm", megatron, monkeypatch)
    code, out, err = planner_main(["export", str(megatron), "--to", "megatron"], monkeypatch)
    assert code == 0, err
    assert "priced for" not in err + out
