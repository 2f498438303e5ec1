"""``planner run``'s straggler detector at work: each rank times its steps and its collectives
(``runtime.collective_clock``), the ranks exchange a window's figures, and every rank judges them
alike (``runtime.stragglers``). A named rank is logged (by rank 0) and kept for the run report;
under ``OnFault.EXIT`` every rank learns it at the same step and stops there.

Cost: two ``perf_counter`` calls per collective and per step, and one all-gather of 2 K float64
per rank every K = ``window_steps`` steps (48 bytes a rank at K = 3), at a step boundary, with no
barrier of its own.
"""

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist

from planner.schemas import OnFault, Straggler, TimingWindow
from runtime.collective_clock import CollectiveClock
from runtime.stragglers import DetectorSettings, DetectorState, WindowTimings, describe, observe, peer_groups

logger = logging.getLogger(__name__)


class StragglerWatch:
    """One rank's share of the detector (mutable: it collects a window's timings)."""

    def __init__(
        self,
        *,
        rank: int,
        hosts: Sequence[str],
        stages: Sequence[int],
        first_step: int,
        on_fault: OnFault,
        settings: DetectorSettings | None = None,
    ) -> None:
        """``hosts``, ``stages``: every rank's host name and pipeline stage, in rank order;
        ``first_step``: the first step judged (the warm-up and memory-tracked steps are not)."""
        self.rank, self.hosts, self.first_step, self.on_fault = rank, tuple(hosts), first_step, on_fault
        self.settings = settings or DetectorSettings()
        self.groups = peer_groups(stages)
        self.state = DetectorState.empty(len(hosts))
        self.clock = CollectiveClock()
        self.compute_s: list[float] = []
        self.wait_s: list[float] = []
        self.window_first = first_step
        self.found: list[Straggler] = []
        self.windows: list[TimingWindow] = []
        self.stopped = False
        """Whether this watch stopped the run (a rank named under ``OnFault.EXIT``)."""

    @property
    def judges(self) -> bool:
        """Whether any rank has a peer to be compared with."""
        return any(self.groups)

    def step_done(self, step: int, wall_s: float, inside_s: float) -> bool:
        """Record a step (its wall time and the part of it inside collectives); at a window's end,
        exchange and judge. Whether the job should stop (a rank was named under ``OnFault.EXIT``);
        every rank returns the same."""
        if step < self.first_step or not self.judges:
            return False
        if not self.compute_s:
            self.window_first = step
        self.compute_s.append(max(wall_s - inside_s, 0.0))
        self.wait_s.append(inside_s)
        if len(self.compute_s) < self.settings.window_steps:
            return False
        mine = torch.tensor([*self.compute_s, *self.wait_s], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in self.hosts]
        dist.all_gather(everyone, mine)
        steps = len(self.compute_s)
        by_rank = [t.tolist() for t in everyone]
        window = WindowTimings(
            first_step=self.window_first,
            compute_s=tuple(tuple(r[i] for r in by_rank) for i in range(steps)),
            wait_s=tuple(tuple(r[steps + i] for r in by_rank) for i in range(steps)),
        )
        self.compute_s, self.wait_s = [], []
        self.windows.append(
            TimingWindow(first_step=window.first_step, compute_s=window.compute_s, wait_s=window.wait_s)
        )
        self.state, findings = observe(self.state, window, self.groups, self.settings)
        for finding in findings:
            message = describe(finding, self.hosts)
            if self.rank == 0:
                logger.warning("%s", message)
            self.found.append(
                Straggler(
                    rank=finding.rank,
                    host=self.hosts[finding.rank],
                    since_step=finding.since_step,
                    named_at_step=finding.named_at_step,
                    compute_s=finding.compute_s,
                    peers=finding.peers,
                    peers_compute_s=finding.peers_compute_s,
                    peers_wait_s=finding.peers_wait_s,
                    message=message,
                )
            )
        self.stopped = bool(findings) and self.on_fault is OnFault.EXIT
        return self.stopped

    @property
    def checks(self) -> int:
        """Rank-windows judged so far."""
        return self.state.checks
