"""Search constraints (``SearchSpace.constrained``, ``planner search --tp 8 --pp 1-16 ...``):
a constrained space is exactly the unconstrained one filtered (tensor parallelism across nodes
aside, which only a constraint opens), an over-constrained search names the constraint that
emptied it, and the options parse as written or fail in one line."""

import pytest
from harness import planner_main

from planner import api
from planner.cli.options import parse_constraint
from planner.files.models import load_model
from planner.schemas import ContextParallelKind, Recompute, Schedule, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.settings import SearchSettings
from planner.search_engine.axes import AXES
from planner.search_engine.space import SearchSpace

MODEL = load_model("llama3-70b")
TRAINING = TrainingSpec(global_batch_size=256, seq_len=4096)
SPACE = SearchSpace(model=MODEL, training=TRAINING, world_size=64, devices_per_node=8)


def test_options_parse_values_ranges_and_lists() -> None:
    assert parse_constraint("--pp", "1-4,8", None) == {1, 2, 3, 4, 8}
    assert parse_constraint("--tp", "8", None) == {8}
    assert parse_constraint("--zero-stage", "1,3", ZeroStage) == {ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS}
    assert parse_constraint("--schedule", "1F1B", Schedule) == {Schedule.ONE_F_ONE_B}
    for text, kind in (("1-x", None), ("4-2", None), ("5", ZeroStage), ("lazy", Recompute)):
        with pytest.raises(SchemaError) as raised:
            parse_constraint("--opt", text, kind)
        assert str(raised.value).startswith(f"--opt {text!r}:") and "\n" not in str(raised.value)


def test_a_constrained_space_is_the_space_filtered() -> None:
    constraints = {"pp": {1, 2, 4}, "zero_stage": {ZeroStage.OPTIMIZER}, "recompute": {Recompute.FULL}}
    fields = {axis.name: axis.field for axis in AXES}

    def allowed(layout: object) -> bool:
        return all(getattr(layout, fields[name]) in values for name, values in constraints.items())

    narrowed = list(SPACE.constrained(constraints).candidates())
    assert narrowed == [c for c in SPACE.candidates() if allowed(c)]
    assert 0 < len(narrowed) < SPACE.size()


def test_a_constraint_on_tp_may_cross_nodes() -> None:
    gpt3 = SearchSpace(model=load_model("gpt3-175b"), training=TRAINING, world_size=128, devices_per_node=8)
    assert 16 not in gpt3.choices("tp")
    assert gpt3.constrained({"tp": {16}}).choices("tp") == [16]
    assert SPACE.constrained({"tp": {16}}).choices("tp") == []  # llama3-70b's 8 key/value heads: never 16


def test_an_over_constrained_search_names_the_constraint() -> None:
    with pytest.raises(InfeasibleConfigError) as raised:
        api.search(
            MODEL, "dgx-h100:8", TRAINING, SearchSettings(constraints={"tp": [8], "pp": [16], "zero_stage": [3]})
        )
    message = str(raised.value)
    assert "without the one on pp," in message and "without the one on zero_stage" not in message


def test_unknown_axis_is_refused() -> None:
    with pytest.raises(SchemaError, match="no search axis 'tensor'"):
        SPACE.constrained({"tensor": [8]})


def test_the_plans_keep_to_the_constraints_from_python_and_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = api.search(
        MODEL, "dgx-h100:8", TRAINING, SearchSettings(top_k=3, constraints={"tp": [4], "pp": range(1, 5)})
    )
    assert plans and all(p.layout.tensor_parallel_degree == 4 and p.layout.pipeline_parallel_degree <= 4 for p in plans)
    args = ["search", "-m", "llama3-70b", "-c", "dgx-h100:8", "--global-batch-size", "256", "--seq-len", "4096"]
    code, _, err = planner_main([*args, "--pp", "two"], monkeypatch)
    assert code == 2 and err.strip().count("\n") == 0 and "--pp 'two'" in err


def test_a_constraint_on_the_kind_of_context_parallelism_leaves_cp_1_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    long = SearchSpace(
        model=load_model("llama3-8b"),
        training=TrainingSpec(global_batch_size=8, seq_len=32768),
        world_size=8,
        devices_per_node=8,
    )
    a2a = ContextParallelKind.ALL_TO_ALL
    narrowed = list(long.constrained({"cp_kind": {a2a}}).candidates())
    assert {c.context_parallel_degree for c in narrowed} == {1, 2, 4, 8}  # 32768 / 8 = 4096 tokens a rank
    assert all(c.context_parallel_kind is a2a for c in narrowed if c.context_parallel_degree > 1)
    assert narrowed == [
        c for c in long.candidates() if c.context_parallel_degree == 1 or c.context_parallel_kind is a2a
    ]
    args = ["search", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "32768"]
    code, out, _ = planner_main([*args, "--cp", "2-8", "--cp-kind", "all-to-all", "--max-tp", "1"], monkeypatch)
    assert code == 0 and "a2a" in out, out
    code, _, err = planner_main([*args, "--cp-kind", "ulysses"], monkeypatch)
    assert code == 2 and "--cp-kind 'ulysses': 'ulysses' is not one of ring, all-to-all" in err
    estimate = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "32768"]
    code, out, _ = planner_main([*estimate, "--dp", "4", "--cp", "2", "--cp-kind", "all-to-all"], monkeypatch)
    assert code == 0 and "cp2a2a" in out, out
