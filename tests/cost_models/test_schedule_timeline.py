"""The pipeline replayed op by op: hand-worked 1F1B and GPipe schedules, and a timeline as long as
the estimate's pipeline terms when the stages are equal (shorter when they are not)."""

import pytest
from conftest import make_cluster

from cost_models.estimate import estimate
from cost_models.schedule_timeline import (
    Activity,
    ChunkTimes,
    estimate_timeline,
    pipeline_time_s,
    pipeline_timeline,
)
from planner.schemas import DType, Layout, ModelSpec, Schedule, TrainingSpec, VocabularyLayout


def _starts(schedule: Schedule, stages: int, micro_batches: int) -> dict[tuple[int, Activity], list[float]]:
    chunk = ChunkTimes(forward_s=1.0, backward_s=2.0)
    timeline = pipeline_timeline(schedule, (chunk,) * stages, micro_batches)
    starts: dict[tuple[int, Activity], list[float]] = {}
    for span in sorted(timeline.spans, key=lambda s: s.start_s):
        starts.setdefault((span.stage, span.activity), []).append(span.start_s)
    return starts


def test_one_f_one_b_on_two_stages_and_four_micro_batches_by_hand() -> None:
    # forward 1 s, backward 2 s. Stage 0 warms up with one forward (p - s - 1 = 1), then
    # F1 B0 F2 B1 F3 B2, then B3; stage 1 alternates from the start. B0 on stage 0 waits for
    # stage 1's B0 (2..4), and its F2 waits for its own B0: (m + p - 1)(f + b) = 5 x 3 = 15 s.
    starts = _starts(Schedule.ONE_F_ONE_B, 2, 4)
    assert starts[(0, Activity.FORWARD)] == [0, 1, 6, 9]
    assert starts[(0, Activity.BACKWARD)] == [4, 7, 10, 13]
    assert starts[(1, Activity.FORWARD)] == [1, 4, 7, 10]
    assert starts[(1, Activity.BACKWARD)] == [2, 5, 8, 11]
    chunk = ChunkTimes(forward_s=1.0, backward_s=2.0)
    timeline = pipeline_timeline(Schedule.ONE_F_ONE_B, (chunk, chunk), 4)
    assert timeline.length_s == 15
    assert timeline.busy_s(0) == timeline.busy_s(1) == 12  # 3 s of bubble each


def test_gpipe_runs_every_forward_first() -> None:
    starts = _starts(Schedule.GPIPE, 2, 4)
    assert starts[(1, Activity.FORWARD)] == [1, 2, 3, 4]
    assert starts[(1, Activity.BACKWARD)] == [5, 7, 9, 11]
    assert starts[(0, Activity.BACKWARD)] == [7, 9, 11, 13]


@pytest.mark.parametrize(
    ("schedule", "p", "v", "m"),
    [
        (Schedule.GPIPE, 4, 1, 8),
        (Schedule.ONE_F_ONE_B, 4, 1, 8),
        (Schedule.ONE_F_ONE_B, 3, 1, 2),
        (Schedule.INTERLEAVED, 2, 2, 4),
        (Schedule.INTERLEAVED, 4, 2, 8),
        (Schedule.INTERLEAVED, 4, 3, 8),
    ],
)
def test_equal_stages_last_the_closed_form(schedule: Schedule, p: int, v: int, m: int) -> None:
    # SC21: (m v + p - 1) slots of one chunk's forward and backward, each op with one transfer.
    f, b, hop = 1.0 / v, 2.0 / v, 0.1
    chunk = ChunkTimes(forward_s=f, backward_s=b)
    timeline = pipeline_timeline(schedule, (chunk,) * p, m, virtual_stages=v, transfer_s=hop)
    assert timeline.length_s == pytest.approx((m * v + p - 1) * (f + b + 2 * hop))


def test_uneven_stages_end_before_the_slowest_stage_bound() -> None:
    fast, slow = ChunkTimes(forward_s=1.0, backward_s=2.0), ChunkTimes(forward_s=2.0, backward_s=4.0)
    timeline = pipeline_timeline(Schedule.ONE_F_ONE_B, (fast, slow, fast), 6)
    assert 6 * 6 < timeline.length_s < (6 + 2) * 6


MODEL = ModelSpec(
    name="timeline-test",
    hidden_size=1024,
    num_hidden_layers=8,
    num_attention_heads=8,
    vocab_size=32000,
    tie_word_embeddings=False,
)
TRAINING = TrainingSpec(global_batch_size=32, seq_len=1024, dtype=DType.BF16)


@pytest.mark.parametrize(
    ("schedule", "v", "tp", "cp"),
    [
        (Schedule.ONE_F_ONE_B, 1, 1, 1),
        (Schedule.ONE_F_ONE_B, 1, 2, 1),
        (Schedule.ONE_F_ONE_B, 1, 1, 2),  # the ring's exposed time is in the stages' time (it was left out)
        (Schedule.GPIPE, 1, 1, 1),
    ],
)
def test_equal_stages_last_the_estimates_pipeline_time(schedule: Schedule, v: int, tp: int, cp: int) -> None:
    # The vocabulary split over the pipeline, run as the paper's schedule runs it (its collectives
    # behind the layers), gives every stage the same share: equal stages.
    layout = Layout(
        data_parallel_degree=1,
        context_parallel_degree=cp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=4,
        micro_batch_size=1,
        schedule=schedule,
        virtual_stages=v,
        vocabulary_layout=VocabularyLayout.VOCAB_2 if schedule is Schedule.ONE_F_ONE_B else VocabularyLayout.PINNED,
    )
    cluster = make_cluster(per_node=4 * tp * cp)
    training = TRAINING.model_copy(update={"vocabulary_overlap": True})
    est = estimate(MODEL, training, cluster, layout)
    assert (est.time.context_parallel_comm_s > 0) == (cp > 1)
    timeline = estimate_timeline(MODEL, training, cluster, layout)
    if schedule is Schedule.ONE_F_ONE_B:
        busy = [timeline.busy_s(s) for s in range(4)]
        assert max(busy) == pytest.approx(min(busy), rel=1e-5)  # equal stages indeed (to rounding)
        assert timeline.length_s == pytest.approx(pipeline_time_s(est.time), rel=1e-5)
    else:  # pinned: the first and last stage are slower; the estimate charges every slot at the slowest
        assert timeline.length_s <= pipeline_time_s(est.time) * (1 + 1e-9)
        assert timeline.length_s > 0.9 * pipeline_time_s(est.time)
