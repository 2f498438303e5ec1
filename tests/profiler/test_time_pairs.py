"""``profiler.ops.time_pairs``: a forward + backward timed no slower than its forward alone (a slow
spell of a shared machine) is timed again, alone, at most ``RETIMES`` times; consistent pairs
are timed once. A stub context plays the clock: each ``time_each`` call answers from a script."""

from collections.abc import Callable, Sequence

import pytest

from profiler import ops
from profiler.stats import Timing


class ScriptedClock:
    """Answers each ``time_each`` call with the next medians of its script, one per function."""

    def __init__(self, script: list[list[float]]) -> None:
        self.script = script
        self.asked: list[list[str]] = []

    def time_each(
        self, fns: Sequence[Callable[[], object]], *, repeats: int | None = None, lockstep: bool = False
    ) -> list[Timing]:
        assert lockstep  # every rank must re-time the same pairs: only lockstep timings agree
        self.asked.append([fn.__name__ for fn in fns])
        medians = self.script.pop(0)
        assert len(medians) == len(fns)
        return [Timing(m, 0.0) for m in medians]


def _pair(name: str) -> list[Callable[[], object]]:
    def forward() -> None: ...

    def both() -> None: ...

    forward.__name__, both.__name__ = f"{name}.fwd", f"{name}.both"
    return [forward, both]


def _medians(timed: list[tuple[Timing, Timing]]) -> list[tuple[float, float]]:
    return [(f.median_s, b.median_s) for f, b in timed]


def test_consistent_pairs_are_timed_once() -> None:
    clock = ScriptedClock([[1.0, 3.0, 2.0, 5.0]])
    timed = ops.time_pairs(clock, [_pair("a"), _pair("b")])  # type: ignore[arg-type]
    assert _medians(timed) == [(1.0, 3.0), (2.0, 5.0)]
    assert len(clock.asked) == 1


def test_an_inverted_pair_is_timed_again_alone_and_its_new_timing_stands() -> None:
    clock = ScriptedClock([[1.0, 3.0, 4.0, 3.5], [2.0, 6.0]])  # b's backward "took" nothing
    timed = ops.time_pairs(clock, [_pair("a"), _pair("b")])  # type: ignore[arg-type]
    assert _medians(timed) == [(1.0, 3.0), (2.0, 6.0)]
    assert clock.asked == [["a.fwd", "a.both", "b.fwd", "b.both"], ["b.fwd", "b.both"]]


@pytest.mark.parametrize("equal", [False, True], ids=["below", "equal"])
def test_a_pair_that_stays_inverted_is_timed_at_most_retimes_more_times(equal: bool) -> None:
    bad = [2.0, 2.0 if equal else 1.5]
    clock = ScriptedClock([[1.0, 3.0, *bad]] + [bad] * ops.RETIMES)
    timed = ops.time_pairs(clock, [_pair("a"), _pair("b")])  # type: ignore[arg-type]
    assert len(clock.asked) == 1 + ops.RETIMES and not clock.script
    assert _medians(timed) == [(1.0, 3.0), tuple(bad)]  # the last timing stands
