"""The collective clock's CUDA branch, its bookkeeping checked on the CPU: on a CUDA device each
collective is bracketed by two events instead of host clock reads, and their times are added (in
all and per group) only when the clock is read, after the last event is waited for. Stand-in
events replace CUDA's (their ``elapsed_time`` is fixed); the collectives are a one-rank gloo
group's. The events' timing itself needs a GPU (tests/runtime/test_cuda_paths.py)."""

from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from runtime.collective_clock import CollectiveClock


class StandInEvent:
    """A recorded event: the order it was recorded in, in milliseconds after the first."""

    recorded: ClassVar[list["StandInEvent"]] = []

    def __init__(self, **_: object) -> None:
        self.at_ms = 0.0
        self.waited = False

    def record(self) -> None:
        self.at_ms = 5.0 * len(StandInEvent.recorded)  # each event 5 ms after the one before
        StandInEvent.recorded.append(self)

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: "StandInEvent") -> float:
        return end.at_ms - self.at_ms


def test_on_cuda_collectives_are_timed_by_events_read_when_the_clock_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)  # the clock reads torch.cuda.Event when it records
    monkeypatch.setattr(StandInEvent, "recorded", [])
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        clock = CollectiveClock(torch.device("cuda", 0))
        with clock.running():
            dist.all_reduce(torch.ones(4))  # events 0 and 1: 5 ms
            dist.broadcast(torch.ones(4), src=0)  # events 2 and 3: 5 ms
        assert len(StandInEvent.recorded) == 4 and not StandInEvent.recorded[-1].waited  # nothing read yet
        assert clock.inside_s == pytest.approx(0.010)
        assert StandInEvent.recorded[-1].waited
        assert clock.inside_by_group_s == {(0,): pytest.approx(0.010)}
        assert clock.inside_s == pytest.approx(0.010)  # read once: not added twice
    finally:
        dist.destroy_process_group()


def test_on_the_cpu_no_event_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)  # the clock reads torch.cuda.Event when it records
    monkeypatch.setattr(StandInEvent, "recorded", [])
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        clock = CollectiveClock(torch.device("cpu"))
        with clock.running():
            dist.all_reduce(torch.ones(4))
        assert StandInEvent.recorded == [] and clock.inside_s > 0
    finally:
        dist.destroy_process_group()
