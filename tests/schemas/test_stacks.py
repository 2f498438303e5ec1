"""The stack table: every stack names a source for every behaviour, a TrainingSpec takes its values
unless given its own, and moving a training to another stack keeps what the user chose."""

import json
from pathlib import Path

import pytest
from harness import planner_main
from hypothesis import given
from hypothesis import strategies as st

from planner.files.plans import load_plan, save_plan
from planner.schemas import STACKS, DType, Kernels, PipelineBuffers, StackName, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.stacks import BEHAVIOURS, DEFAULT_STACK, stack_named

STACK_NAMES = list(StackName)


def _training(**fields: object) -> TrainingSpec:
    return TrainingSpec.model_validate({"global_batch_size": 8, "seq_len": 128, **fields})


def test_the_table_has_one_stack_per_name_each_with_a_source_for_every_behaviour() -> None:
    assert set(STACKS) == set(StackName)
    for name, stack in STACKS.items():
        assert stack.name is name
        assert set(stack.sources) == set(BEHAVIOURS), name
        assert all(source.strip() for source in stack.sources.values()), name


@pytest.mark.parametrize("name", STACK_NAMES)
def test_a_training_takes_its_stacks_values_and_overrides_none(name: StackName) -> None:
    training = _training(stack=name)
    for field, value in STACKS[name].behaviours(DType.BF16).items():
        assert getattr(training, field) == value, field
    assert training.overrides == {}


def test_the_default_stack_is_what_planner_run_runs() -> None:
    training = _training()
    assert training.stack is DEFAULT_STACK is StackName.PLANNER_RUNTIME
    assert training.kernels is Kernels.EAGER  # runtime.model: eager PyTorch
    assert training.pipeline_buffers is PipelineBuffers.PER_MICRO_BATCH  # torch.distributed.pipelining


def test_deepspeed_reduces_in_the_training_precision() -> None:
    assert _training(stack="deepspeed").reduce_dtype is DType.BF16
    assert _training(stack="deepspeed", dtype="fp16").reduce_dtype is DType.FP16
    assert _training(stack="megatron-lm").reduce_dtype is DType.FP32


def test_a_value_given_beside_the_stack_is_an_override() -> None:
    training = _training(stack="megatron-lm", kernels="eager", tp_comm_overlap=True)
    assert training.overrides == {"kernels": Kernels.EAGER, "tp_comm_overlap": True}
    assert training.loss_kernels is Kernels.EAGER  # the rest stays megatron-lm's


@given(source=st.sampled_from(STACK_NAMES), target=st.sampled_from(STACK_NAMES), overlap=st.booleans())
def test_under_another_stack_the_users_choices_are_kept(source: StackName, target: StackName, overlap: bool) -> None:
    training = _training(stack=source, tp_comm_overlap=overlap)
    moved = training.under(target)
    assert moved.stack is target
    assert moved.tp_comm_overlap is overlap
    assert (moved.global_batch_size, moved.seq_len, moved.dtype) == (8, 128, training.dtype)
    for field, value in STACKS[target].behaviours(training.dtype).items():
        if field not in training.overrides:
            assert getattr(moved, field) == value, field
    assert moved.under(source) == training  # and back: nothing lost


def test_options_over_a_plans_training_move_the_stack_first() -> None:
    training = _training(kernels="fused")  # planner-runtime with fused kernels
    moved = training.with_options({"stack": "megatron-lm", "loss_kernels": None})
    assert moved.stack is StackName.MEGATRON_LM
    assert moved.overrides == {"loss_kernels": None}
    with pytest.raises(SchemaError, match="seq_len"):
        training.with_options({"seq_len": 0})


def test_an_unknown_stack_is_named_with_the_known_ones() -> None:
    with pytest.raises(SchemaError, match="'nemo' is not one of planner-runtime, megatron-lm"):
        stack_named("nemo")


def test_a_version_12_plan_reads_with_version_12s_behaviours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before stacks, a plan that named no kernels was priced with fused ones: it still is."""
    written = tmp_path / "plan.json"
    args = ["estimate", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "128"]
    code, _, err = planner_main([*args, "--dp", "8", "--output", str(written)], monkeypatch)
    assert code == 0, err
    raw = json.loads(written.read_text())
    raw["schema_version"] = 12
    training = {k: v for k, v in raw["training"].items() if k not in (*BEHAVIOURS, "stack")}
    old = tmp_path / "v12.json"
    old.write_text(json.dumps({**raw, "training": training}))
    plan = load_plan(old)
    assert plan.training.stack is StackName.PLANNER_RUNTIME
    assert plan.training.kernels is Kernels.FUSED
    assert plan.training.overrides == {"kernels": Kernels.FUSED}
    save_plan(plan, tmp_path / "again.json")
    assert load_plan(tmp_path / "again.json") == plan
