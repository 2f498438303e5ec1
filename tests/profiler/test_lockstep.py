"""Lockstep timing on 2 gloo ranks: each repeat counts the slowest rank, as a synchronous step
waits for it, and calls a short op back to back alike on every rank; and the threads and core
share of CPU ranks."""

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks

from planner.schemas.settings import ProfileSettings
from profiler import context
from profiler.context import Context
from runtime import threads

SLOW_S = 0.05


def _time_both_ways() -> dict[str, Any]:
    rank = dist.get_rank()
    ctx = Context(rank, 2, rank, 2, torch.device("cpu"), ProfileSettings(), store=None)

    def work() -> None:
        time.sleep(SLOW_S if rank == 1 else 0.001)

    own = ctx.time(work, warmup=0, repeats=3)
    lockstep = ctx.time(work, warmup=0, repeats=3, lockstep=True)
    return {"own": own.median_s, "lockstep": lockstep.median_s}


@pytest.mark.distributed
def test_lockstep_counts_the_slowest_rank(tmp_path: Path) -> None:
    result = run_ranks(2, _time_both_ways, workdir=tmp_path)
    assert result["own"] < SLOW_S / 2  # rank 0's own time
    assert result["lockstep"] >= SLOW_S  # rank 1's


class _Clock:
    """A clock that only the timed op moves: the counts below do not depend on how long a sleep
    lasts on a busy machine (on a loaded CI machine a 1 ms sleep lasted 2.5 ms)."""

    now_s = 0.0

    def perf_counter(self) -> float:
        return self.now_s


def _count_calls() -> dict[str, Any]:
    rank = dist.get_rank()
    clock = _Clock()
    context.time = clock  # type: ignore[attr-defined]  # in this rank's process only
    settings = ProfileSettings(min_sample_s=2**-6)  # 15.6 ms
    ctx = Context(rank, 2, rank, 2, torch.device("cpu"), settings, store=None)
    calls = [0]

    def work() -> None:
        calls[0] += 1
        clock.now_s += 2**-8 if rank == 0 else 2**-10  # 3.9 ms on rank 0, 0.98 ms on rank 1

    timing = ctx.time(work, warmup=1, repeats=3, lockstep=True)
    every = [None, None]
    dist.all_gather_object(every, calls[0])
    return {"calls": every, "median_s": timing.median_s}


@pytest.mark.distributed
def test_lockstep_calls_a_short_op_until_a_sample_lasts_long_enough(tmp_path: Path) -> None:
    result = run_ranks(2, _count_calls, workdir=tmp_path)
    # Rank 1's op needs 16 calls to last 15.6 ms (rank 0's, 4); both make the larger count:
    # 1 warm-up call, then 3 repeats of 16 calls.
    assert result["calls"] == [1 + 3 * 16, 1 + 3 * 16]
    # A sample is one call's share of the slowest rank's loop: rank 0's 3.9 ms.
    assert result["median_s"] == 2**-8


@pytest.mark.parametrize(
    ("cores", "ranks", "per_rank", "share"),
    [(2, 4, 1, 0.5), (2, 2, 1, 1.0), (8, 4, 2, 1.0), (6, 4, 1, 1.0), (1, 3, 1, 1 / 3)],
)
def test_threads_and_core_share(
    monkeypatch: pytest.MonkeyPatch, cores: int, ranks: int, per_rank: int, share: float
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    assert threads.cpu_threads_per_rank(ranks) == per_rank
    assert threads.core_share(ranks) == pytest.approx(share)
