"""What every profiling phase needs: this rank's place in the job, the settings, the store that
records how far each rank got, and a clock that all ranks start together."""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from planner.schemas.settings import ProfileSettings
from profiler.stats import Timing
from runtime import Heartbeat, act_out_fault

HEARTBEAT_KEY = "planner/profile/at/{rank}"


@dataclass
class Context:
    """One rank's view of a profiling run (mutable: it tracks the phase it is in)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    settings: ProfileSettings
    store: Any
    """The job's key-value store (torch.distributed.Store)."""
    on_step: Callable[[str, str], None] = field(default=lambda phase, step: None)
    """Told of every step (phase, what it measures): rank 0's progress line."""
    on_expect: Callable[[str, int], None] = field(default=lambda phase, steps: None)
    """Told how many steps a phase will take, where it knows beforehand."""
    heartbeat: Heartbeat = field(init=False)
    """Where this rank is, in the store, for naming the rank left behind (``runtime.Heartbeat``)."""

    def __post_init__(self) -> None:
        self.heartbeat = Heartbeat(self.rank, self.world_size, self.store, HEARTBEAT_KEY)

    def expect(self, phase: str, steps: int) -> None:
        """Announce that ``phase`` will take ``steps`` steps (``at`` calls), for the progress line."""
        self.on_expect(phase, steps)

    def at(self, phase: str, step: str = "") -> None:
        """Record where this rank is, so a failure elsewhere can be traced to the rank left behind."""
        self.heartbeat.at(phase, step)
        self.on_step(phase, step)
        fault = self.settings.inject_fault
        if fault is not None and fault[0] == self.rank and fault[1] == phase:
            act_out_fault(fault[2], self.settings.timeout_s)

    def sync(self) -> None:
        """Wait for every rank (and, on CUDA, for queued kernels)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dist.barrier()

    def time(
        self,
        fn: Callable[[], Any],
        *,
        warmup: int | None = None,
        repeats: int | None = None,
        lockstep: bool = False,
    ) -> Timing:
        """Median and spread of ``fn``'s wall time over repeats, after warm-up; ranks start each
        repeat together, so what runs at once on other ranks contends as in a real job.

        ``lockstep``: every rank runs ``fn`` and each repeat counts the slowest rank's time, as
        a synchronous training step waits for its slowest rank (every rank gets the same Timing).
        Ranks that share cores finish a repeat at different times, the slowest well after the
        median rank.
        """
        (timing,) = self.time_each([fn], warmup=warmup, repeats=repeats, lockstep=lockstep)
        return timing

    def time_each(
        self,
        fns: Sequence[Callable[[], Any]],
        *,
        warmup: int | None = None,
        repeats: int | None = None,
        lockstep: bool = False,
    ) -> list[Timing]:
        """``time`` of each of ``fns``, timed in rounds of one repeat of each: a slow spell of
        the machine then falls on all of them alike, not on whichever was being timed (on shared
        CPU cores one micro-batch size of a layer, timed in a block, came out far above the line
        through its neighbours).

        With ``lockstep`` a sample calls the op back to back, as often as every rank needs for
        it to last ``settings.min_sample_s``, and counts one call's share. Ranks leave a barrier
        at different moments; on shared cores a short op then runs while others have not started,
        faster than in training, where every rank stays busy (on shared CPU cores a layer at
        micro-batch 1 timed well under its share at micro-batch 2, and plans of micro-batch 1 ran
        slower than their prediction).
        """
        warmup = self.settings.warmup if warmup is None else warmup
        repeats = self.settings.repeats if repeats is None else repeats
        once = torch.full((len(fns),), float("inf"), dtype=torch.float64)
        for i, fn in enumerate(fns):
            for _ in range(warmup):
                once[i] = min(float(once[i]), self._call_s(fn, 1))
        calls = torch.ones(len(fns), dtype=torch.float64)
        if lockstep:
            if warmup > 0:
                calls = torch.ceil(self.settings.min_sample_s / once.clamp(min=1e-6)).clamp(min=1)
            calls = self._max_over_ranks(calls)  # every rank calls each op alike
        samples = torch.zeros(repeats, len(fns), dtype=torch.float64)
        for r in range(repeats):
            for i, fn in enumerate(fns):
                self.sync()
                samples[r, i] = self._call_s(fn, int(calls[i])) / calls[i]
        if lockstep:
            samples = self._max_over_ranks(samples)
        return [Timing.of(samples[:, i].tolist()) for i in range(len(fns))]

    def _max_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of ``values`` (a CPU tensor) over every rank, on the CPU. The
        reduction runs on the compute device: NCCL takes device tensors only (it refuses a CPU
        tensor), gloo takes either."""
        on_device = values.to(self.device)
        dist.all_reduce(on_device, op=dist.ReduceOp.MAX)
        return on_device.cpu()

    def _call_s(self, fn: Callable[[], Any], calls: int) -> float:
        """Wall seconds of ``calls`` calls of ``fn`` back to back (on CUDA, to the last kernel's end)."""
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out
