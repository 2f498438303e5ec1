"""Gradients a stack allocates on demand replace the activations a stage's first backward frees
when no forward follows it (``memory.LayoutMemory``, ``Stack.gradients_on_demand``); a stack
with a gradient buffer held for the run, and any stage that runs a forward after its first
backward, hold them on top. llama3-8b, s 4096, dp 8 ZeRO-1 on dgx-h100:1: bf16 gradients of
8.03e9 parameters, 16.06e9 bytes on every rank."""

from dataclasses import replace

import pytest
from rich.table import Table

from cost_models.memory import gradients_replace_activations, stage_memory
from cost_models.params import stage_params
from cost_models.sharding import stage_model_states
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import STACKS, Layout, MemoryBreakdown, Recompute, StackName, TrainingSpec, ZeroStage
from planner.views.tables import stack_view

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100:1")
DP8 = Layout(
    data_parallel_degree=8,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.OPTIMIZER,
)


def _memory(batch: int, layout: Layout = DP8, stack: str = "planner-runtime", stage: int = 0) -> MemoryBreakdown:
    training = TrainingSpec(global_batch_size=batch, seq_len=4096, stack=stack)
    return stage_memory(MODEL, training, CLUSTER, layout, stage)


def _gradients_bytes(layout: Layout = DP8) -> float:
    training = TrainingSpec(global_batch_size=8, seq_len=4096)
    params = stage_params(MODEL, layout, 0)
    return stage_model_states(MODEL, layout, params, training.precision).gradients_bytes


def test_one_micro_batch_frees_more_activations_than_its_gradients_take() -> None:
    gradients = _gradients_bytes()
    assert gradients == pytest.approx(2 * 8.03e9, rel=0.01)
    one, two = _memory(8), _memory(16)  # 1 and 2 micro-batches per step
    assert two.gradients_bytes == gradients  # the second micro-batch's forward runs beside them
    # One micro-batch of activations (17.1 GiB) and its loss outweigh the gradients: the peak is
    # the forward's end, before any gradient exists; every other term is the same
    assert one.gradients_bytes == 0.0
    assert two.total_bytes - one.total_bytes == pytest.approx(gradients, rel=1e-12)


def test_with_full_recompute_the_gradients_add_what_they_exceed_the_freed_activations_by() -> None:
    layout = replace(DP8, recompute=Recompute.FULL)
    gradients = _gradients_bytes(layout)
    one, two = _memory(8, layout), _memory(16, layout)
    # Full recompute keeps each layer's input alone, 32 x 4096 x 4096 x 2 bytes = 1 GiB, plus the
    # loss: the gradients exceed them, and the peak is the backward's end
    assert 0.0 < one.gradients_bytes < gradients
    freed = gradients - one.gradients_bytes
    assert 2**30 < freed < one.activations_bytes + one.logits_bytes
    assert two.total_bytes - one.total_bytes == pytest.approx(freed, rel=1e-12)


def test_a_gradient_buffer_held_for_the_run_adds_whole() -> None:
    assert not gradients_replace_activations(TrainingSpec(global_batch_size=8, seq_len=4096, stack="megatron-lm"), DP8)
    one, two = _memory(8, stack="megatron-lm"), _memory(16, stack="megatron-lm")
    assert one.gradients_bytes == two.gradients_bytes > 0
    assert one.total_bytes == two.total_bytes


@pytest.mark.parametrize(("batch", "relieved"), [(4, True), (8, True), (16, False)])
def test_under_1f1b_the_first_stage_holds_every_micro_batch_until_m_exceeds_p(batch: int, relieved: bool) -> None:
    # dp4 pp2: m = batch / 4 micro-batches; the first stage holds min(2, m) in flight, the last 1
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
    )
    training = TrainingSpec(global_batch_size=batch, seq_len=4096)
    assert gradients_replace_activations(training, layout) is relieved
    first, last = _memory(batch, layout), _memory(batch, layout, stage=1)
    assert (first.gradients_bytes < _gradients_bytes(layout)) is relieved
    # The last stage holds one micro-batch in flight: relieved only with one micro-batch per step
    assert (
        last.gradients_bytes
        < stage_model_states(MODEL, layout, stage_params(MODEL, layout, 1), training.precision).gradients_bytes
    ) is (batch == 4)


@pytest.mark.parametrize("name", list(StackName))
def test_every_stack_says_where_its_gradient_lifetime_comes_from(name: StackName) -> None:
    stack = STACKS[name]
    assert stack.gradients_source.strip()
    shown = {row[0]: row[1:] for row in _rows(stack_view(stack))}
    assert shown["gradients"][0] == ("on demand" if stack.gradients_on_demand else "held for the run")


def _rows(table: Table) -> list[list[str]]:
    cells = [list(map(str, column._cells)) for column in table.columns]
    return [list(row) for row in zip(*cells, strict=True)]
