"""What overlapped communication costs the compute it runs behind (cost_models.overlap)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models.overlap import OVERLAP_COMPUTE_SLOWDOWN, overlapped_comm_cost_s


def test_a_short_collective_slows_the_compute_beside_it() -> None:
    # 1 s of communication behind 10 s of compute slowed by 25% while it runs: the compute does
    # 0.8 s of work during it, 9.2 s after; the window takes 10.2 s.
    assert overlapped_comm_cost_s(1.0, 10.0, slowdown=0.25) == pytest.approx(0.2)


def test_a_long_collective_outlasts_its_window() -> None:
    # 10 s behind 4 s: the compute is done under it; the window takes the communication's 10 s.
    assert overlapped_comm_cost_s(10.0, 4.0, slowdown=0.25) == pytest.approx(6.0)


def test_free_overlap_is_the_old_rule_and_no_communication_costs_nothing() -> None:
    assert overlapped_comm_cost_s(3.0, 5.0, slowdown=0.0) == 0.0
    assert overlapped_comm_cost_s(7.0, 5.0, slowdown=0.0) == 2.0
    assert overlapped_comm_cost_s(0.0, 5.0) == 0.0


def test_the_published_average_costs_a_sixth_of_what_it_hides() -> None:
    assert overlapped_comm_cost_s(1.0, 100.0) == pytest.approx(0.189 / 1.189)
    assert OVERLAP_COMPUTE_SLOWDOWN == 0.189


@given(
    comm=st.floats(0.0, 100.0),
    window=st.floats(0.0, 100.0),
    slowdown=st.floats(0.0, 1.0),
)
def test_overlap_costs_no_more_than_serial_and_no_less_than_what_overflows(
    comm: float, window: float, slowdown: float
) -> None:
    cost = overlapped_comm_cost_s(comm, window, slowdown)
    assert max(0.0, comm - window) <= cost <= comm + 1e-12
