"""Layer split, in-flight micro-batches and bubbles of the pipeline schedules."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models.pipeline import bubble_fraction
from planner.schemas import Layout, ModelSpec, Schedule
from planner.schemas.geometry import chunk_layers, in_flight_micro_batches, stage_layers

MODEL = ModelSpec(hidden_size=64, num_hidden_layers=10, num_attention_heads=4, vocab_size=100)


def layout(
    p: int, *, v: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B, split: tuple[int, ...] | None = None
) -> Layout:
    sched = Schedule.INTERLEAVED if v > 1 else schedule
    return Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        schedule=sched,
        virtual_stages=v,
        layer_split=split,
    )


def test_even_split_gives_the_remainder_to_the_middle() -> None:
    assert chunk_layers(MODEL, layout(4)) == (2, 3, 3, 2)
    assert stage_layers(MODEL, layout(2, v=2)) == (5, 5)
    assert stage_layers(MODEL, layout(2, split=(3, 7))) == (3, 7)


def test_one_f_one_b_holds_p_minus_rank() -> None:
    assert [in_flight_micro_batches(layout(4), r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches(layout(4), 0, 2) == 2
    assert in_flight_micro_batches(layout(4, schedule=Schedule.GPIPE), 3, 8) == 8


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_interleaved_first_stage_matches_korthikanti(p: int, v: int) -> None:
    assert in_flight_micro_batches(layout(p, v=v), 0, 64) == pytest.approx(p * (1 + (p - 1) / (p * v)))


@given(p=st.integers(1, 16), m=st.integers(1, 64), v=st.integers(1, 4))
def test_more_micro_batches_never_raise_the_bubble(p: int, m: int, v: int) -> None:
    if p == 1:
        v = 1
    lay = layout(p, v=v)
    assert bubble_fraction(lay, m + 1) <= bubble_fraction(lay, m)
    assert bubble_fraction(lay, m) == pytest.approx((p - 1) / (v * m))
