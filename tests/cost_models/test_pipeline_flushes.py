"""A step run as several pipeline schedules (TrainingSpec.pipeline_flushes): each fills and drains
the pipeline, holds one schedule's micro-batches in flight, and must divide the step evenly."""

from dataclasses import replace

import pytest

from cost_models.estimate import estimate
from cost_models.layout_validity import check_layout
from cost_models.memory import all_stage_memory
from cost_models.pipeline import bubble_s, micro_batch_slots, pipeline_comm_s
from cost_models.schedule_timeline import estimate_timeline
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, Schedule, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError

FOUR = Layout(data_parallel_degree=2, tensor_parallel_degree=1, pipeline_parallel_degree=4, micro_batch_size=1)
"""8 ranks of dgx-h100:1: 2 replicas of a 4-stage 1F1B pipeline."""


def _training(flushes: int) -> TrainingSpec:
    return TrainingSpec(global_batch_size=16, seq_len=1024, pipeline_flushes=flushes)  # m = 16 / 2 = 8


def test_every_schedule_fills_and_drains_the_pipeline() -> None:
    # p = 4, m = 8, stage 0.5 s. One schedule: (p - 1) / m of m stage times = 3 x 0.5 s. Two of
    # four micro-batches each: 2 x (3 / 4) x 4 x 0.5 s = 3 s, twice the one schedule's bubble.
    assert bubble_s(FOUR, 8, 0.5) == pytest.approx(1.5)
    assert bubble_s(FOUR, 8, 0.5, flushes=2) == pytest.approx(3.0)
    interleaved = replace(FOUR, schedule=Schedule.INTERLEAVED, virtual_stages=2)
    assert bubble_s(interleaved, 8, 0.5, flushes=2) == pytest.approx(2 * 3 / (2 * 4) * 4 * 0.5)
    # critical-path slots: m v steps, plus p - 1 to fill each schedule
    assert micro_batch_slots(FOUR, 8, flushes=2) == 8 + 2 * 3
    assert micro_batch_slots(interleaved, 8, flushes=4) == 16 + 4 * 3


def test_fill_and_drain_transfers_are_paid_per_schedule() -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    one = pipeline_comm_s(model, _training(1), cluster, FOUR, 8)
    two = pipeline_comm_s(model, _training(2), cluster, FOUR, 8)
    # 1F1B without overlap: 2 m + 2 f (p - 1) hops of one hop time each: 22 against 28
    assert two / one == pytest.approx((2 * 8 + 2 * 2 * 3) / (2 * 8 + 2 * 3))


def test_the_step_and_its_timeline_grow_by_the_extra_bubbles_alone() -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    one, two = (estimate(model, _training(f), cluster, FOUR) for f in (1, 2))
    assert two.time.compute_s == pytest.approx(one.time.compute_s)
    assert two.time.pipeline_bubble_s == pytest.approx(2 * one.time.pipeline_bubble_s)
    assert two.step_time_s > one.step_time_s
    timeline_one, timeline_two = (estimate_timeline(model, _training(f), cluster, FOUR) for f in (1, 2))
    assert len(timeline_two.spans) == len(timeline_one.spans)  # the same 8 micro-batches, in two runs
    assert {s.micro_batch for s in timeline_two.spans} == set(range(8))
    assert timeline_two.length_s > timeline_one.length_s


def test_a_schedule_of_fewer_micro_batches_than_stages_holds_fewer_in_flight() -> None:
    # 1F1B's first stage holds min(p, m) micro-batches: 4 with one schedule of 8, 2 with four of 2,
    # beside one MLP's backward either way (SwiGLU: 6 tensors of s b f, 1024 x 14336).
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    four, one = (all_stage_memory(model, _training(f), cluster, FOUR)[0].activations_bytes for f in (4, 1))
    backward = 6 * 2 * 1024 * 14336
    assert four - backward == pytest.approx((one - backward) / 2)


def test_flushes_must_divide_the_step_and_leave_interleaving_whole_schedules() -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    with pytest.raises(InfeasibleConfigError, match=r"pipeline_flushes=3 .* 8 micro-batches .* 3 does not divide 8"):
        check_layout(model, _training(3), cluster, FOUR)
    interleaved = replace(FOUR, schedule=Schedule.INTERLEAVED, virtual_stages=2)
    check_layout(model, _training(2), cluster, interleaved)  # 4 a schedule: divisible by pp 4
    with pytest.raises(InfeasibleConfigError, match=r"micro-batches per schedule, 8 over 4 flushes \(2\) divisible"):
        check_layout(model, _training(4), cluster, interleaved)


def test_without_a_pipeline_flushes_change_nothing() -> None:
    # dp 8, no pipeline: 2 micro-batches a step form no schedule; 3 flushes neither constrain the
    # layout nor change its estimate.
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    flat = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    check_layout(model, _training(3), cluster, flat)
    assert estimate(model, _training(3), cluster, flat) == estimate(model, _training(1), cluster, flat)
