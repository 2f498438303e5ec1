"""Where each rank of a job is, kept in the job's store, so that when a collective fails (a peer
died, or hung until the timeout) the ranks still alive can name the one left behind.

Every rank records "phase|step" as it moves on (``Heartbeat.at``). A rank whose collective fails
marks itself failed, waits ``FAILURE_GRACE_S`` for the other survivors to do the same, and
blames the ranks that did not, with where they last were (``Heartbeat.diagnose``). The profiler
and ``planner run`` share it (C4, Dong et al. HPCA 2025, localizes faults the same way: the
collective's peers that never arrive).
"""

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

FAILURE_GRACE_S = 2.0
"""How long a failing rank waits for the other survivors to say they failed too."""


class Stopped(Exception):
    """This rank was asked to stop (SIGTERM from the launcher, usually because a peer died)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stopped("stopped by the launcher (SIGTERM), usually because another rank failed")


def stop_on_sigterm() -> None:
    """Turn the launcher's SIGTERM into ``Stopped``, so the rank can say why it stops."""
    signal.signal(signal.SIGTERM, _on_sigterm)


SLOW_FAULT_S = 0.05
"""How long the "slow" testing aid sleeps each time, at least."""


def act_out_fault(kind: str, timeout_s: float) -> None:
    """Testing aid: die at once ("exit"), freeze ("hang") for far longer than the job's timeout, or
    lag once ("slow", ``SLOW_FAULT_S``; a straggler that lags again and again is
    ``runtime.run``'s, relative to its own compute)."""
    if kind == "exit":
        os._exit(1)
    time.sleep(SLOW_FAULT_S if kind == "slow" else 10 * timeout_s)


@dataclass
class Heartbeat:
    """One rank's record in the store (mutable: it tracks where the rank is)."""

    rank: int
    world_size: int
    store: Any
    """The job's key-value store (torch.distributed.Store)."""
    key: str
    """Format of each rank's key, with ``{rank}``."""
    phase: str = "start"
    step: str = ""

    def at(self, phase: str, step: str = "") -> None:
        """Record where this rank is."""
        self.phase, self.step = phase, step
        self.store.set(self.key.format(rank=self.rank), f"{phase}|{step}")

    def mark_failed(self) -> None:
        """Tell the other ranks this one is alive but failed (so it is not blamed)."""
        with contextlib.suppress(Exception):  # the store may be gone with the job
            self.store.set(self.key.format(rank=self.rank), f"failed|{self.phase}|{self.step}")

    def where(self, rank: int) -> str:
        """Where ``rank`` last said it was ("phase|step"), or "unknown"."""
        key = self.key.format(rank=rank)
        try:
            if not self.store.check([key]):
                return "unknown"
            return str(self.store.get(key).decode())
        except Exception:  # the store itself may be gone with the job
            return "unknown"

    def diagnose(self, error: BaseException, job: str) -> str:
        """One line naming the ranks that died or hung (see the module docstring) and what this
        rank saw; ``job`` names the work ("profiling", "training")."""
        self.mark_failed()
        time.sleep(FAILURE_GRACE_S)
        silent = {
            r: self.where(r)
            for r in range(self.world_size)
            if r != self.rank and not self.where(r).startswith("failed")
        }
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        if not silent:
            return f"{job} failed on rank {self.rank} during {self.phase} ({self.step or 'start'}): {first_line}"
        blamed = "; ".join(
            f"rank {r} stopped responding in {at.replace('|', ' (', 1) + ')' if '|' in at else at}"
            for r, at in silent.items()
        )
        return f"{job} stopped: {blamed}. Rank {self.rank} gave up during {self.phase}: {first_line}"
