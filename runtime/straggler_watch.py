"""``planner run``'s straggler detector at work: each rank times its steps and its collectives
(``runtime.collective_clock``), the ranks exchange a window's figures, and every rank judges them
alike, for slow ranks (``runtime.stragglers``) and slow links (``runtime.slow_links``). A named rank
or link is logged (by rank 0) and kept for the run report; under ``OnFault.EXIT`` every rank
learns it at the same step and stops there.

Cost: two ``perf_counter`` calls (on CUDA, two event records) and a dictionary look-up per
collective, and one
``all_gather_object`` every K = ``window_steps`` steps, at a step boundary, with no barrier of its
own: per rank, per step of the window, its compute, its wait and its wait in each process group
it used (at K = 3 on tp2 x dp2, a few hundred bytes pickled a rank; the object gather is two
all-gathers, sizes then bytes).
"""

import logging
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from planner.schemas import GroupTiming, OnFault, SlowLink, Straggler, TimingWindow
from runtime.collective_clock import CollectiveClock
from runtime.slow_links import (
    GroupKey,
    GroupWaits,
    LinkFinding,
    LinkSettings,
    LinkState,
    describe_link,
    observe_links,
)
from runtime.stragglers import (
    DetectorSettings,
    DetectorState,
    Finding,
    WindowTimings,
    describe,
    observe,
    peer_groups,
)

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
        link_settings: LinkSettings | None = None,
        axes: Mapping[GroupKey, str] | None = None,
        device: torch.device | None = None,
    ) -> None:
        """``hosts``, ``stages``: every rank's host name and pipeline stage, in rank order;
        ``first_step``: the first step judged (the warm-up and memory-tracked steps are not);
        ``axes``: the mesh axis of each group that lies along one (``axis_groups``), to name it;
        ``device``: the compute device, whose collectives the clock times (CUDA: by events)."""
        self.rank, self.hosts, self.first_step, self.on_fault = rank, tuple(hosts), first_step, on_fault
        self.settings = settings or DetectorSettings()
        self.link_settings = link_settings or LinkSettings()
        self.axes = dict(axes or {})
        self.stages = tuple(stages)
        self.groups = peer_groups(stages)
        self.state = DetectorState.empty(len(hosts))
        self.link_state = LinkState()
        self.clock = CollectiveClock(device)
        self.compute_s: list[float] = []
        self.wait_s: list[float] = []
        self.group_wait_s: list[dict[GroupKey, float]] = []
        self._group_before: dict[GroupKey, float] = {}
        self.window_first = first_step
        self.found: list[Straggler] = []
        self.links: list[SlowLink] = []
        self.windows: list[TimingWindow] = []
        self.stopped = False
        """Whether this watch stopped the run (a rank named under ``OnFault.EXIT``)."""

    @property
    def judges(self) -> bool:
        """Whether any rank has a peer to be compared with."""
        return any(self.groups)

    def step_begins(self) -> None:
        """Mark where a step's time inside each group starts (call before the step's first collective)."""
        self._group_before = dict(self.clock.inside_by_group_s)

    def step_done(self, step: int, wall_s: float, inside_s: float) -> bool:
        """Record a step (its wall time and the part of it inside collectives, and its time inside
        each group since ``step_begins``); at a window's end, exchange and judge. Whether the job
        should stop (a rank or a link was named under ``OnFault.EXIT``); every rank returns the same."""
        if step < self.first_step or not self.judges:
            return False
        if not self.compute_s:
            self.window_first = step
        self.compute_s.append(max(wall_s - inside_s, 0.0))
        self.wait_s.append(inside_s)
        before = self._group_before
        self.group_wait_s.append({k: s - before.get(k, 0.0) for k, s in self.clock.inside_by_group_s.items()})
        if len(self.compute_s) < self.settings.window_steps:
            return False
        everyone: list[tuple[list[float], list[float], list[dict[GroupKey, float]]]] = [([], [], [])] * len(self.hosts)
        dist.all_gather_object(everyone, (self.compute_s, self.wait_s, self.group_wait_s))
        steps = len(self.compute_s)
        window = WindowTimings(
            first_step=self.window_first,
            compute_s=tuple(tuple(r[0][i] for r in everyone) for i in range(steps)),
            wait_s=tuple(tuple(r[1][i] for r in everyone) for i in range(steps)),
        )
        waits = _group_waits([r[2] for r in everyone], steps)
        self.compute_s, self.wait_s, self.group_wait_s = [], [], []
        self.windows.append(
            TimingWindow(
                first_step=window.first_step,
                compute_s=window.compute_s,
                wait_s=window.wait_s,
                groups=tuple(GroupTiming(ranks=w.ranks, wait_s=w.wait_s) for w in waits),
            )
        )
        self.state, findings = observe(self.state, window, self.groups, self.settings)
        self.link_state, link_findings = observe_links(
            self.link_state,
            first_step=window.first_step,
            compute_s=window.compute_s,
            waits=waits,
            stage_of_rank=self.stages,
            peers=self.groups,
            settings=self.link_settings,
            ranks=self.settings,
        )
        self._name_stragglers(findings)
        self._name_links(link_findings)
        self.stopped = bool(findings or link_findings) and self.on_fault is OnFault.EXIT
        return self.stopped

    def _name_stragglers(self, findings: tuple[Finding, ...]) -> None:
        """Log (rank 0) and keep for the report each rank the window's judgement named."""
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

    def _name_links(self, link_findings: tuple[LinkFinding, ...]) -> None:
        """Log (rank 0) and keep for the report each link the window's judgement named, with its mesh axis."""
        for link in link_findings:
            axis = self.axes.get(link.group, "")
            message = describe_link(link, self.hosts, axis)
            if self.rank == 0:
                logger.warning("%s", message)
            self.links.append(
                SlowLink(
                    ranks=link.ranks,
                    hosts=tuple(self.hosts[r] for r in link.ranks),
                    group=link.group,
                    axis=axis,
                    since_step=link.since_step,
                    named_at_step=link.named_at_step,
                    wait_s=link.wait_s,
                    siblings=link.siblings,
                    siblings_wait_s=link.siblings_wait_s,
                    message=message,
                )
            )

    @property
    def checks(self) -> int:
        """Rank-windows judged so far."""
        return self.state.checks

    @property
    def messages(self) -> list[str]:
        """The lines logged for every rank and link named so far."""
        return [s.message for s in self.found] + [link.message for link in self.links]


def _group_waits(by_rank: list[list[dict[GroupKey, float]]], steps: int) -> tuple[GroupWaits, ...]:
    """Per group any rank used in the window: per step, per member, the member's time inside it
    (0 for a member that did not report the group)."""
    keys = sorted({key for rank in by_rank for step in rank for key in step})
    return tuple(
        GroupWaits(
            ranks=key,
            wait_s=tuple(tuple(by_rank[r][i].get(key, 0.0) for r in key) for i in range(steps)),
        )
        for key in keys
    )


def axis_groups(mesh: DeviceMesh) -> dict[GroupKey, str]:
    """Every group along each of ``mesh``'s axes (its ranks, sorted), with the axis's name."""
    ranks, names = mesh.mesh, mesh.mesh_dim_names or ()
    found: dict[GroupKey, str] = {}
    for dim, name in enumerate(names):
        for fiber in ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim]).tolist():
            if len(fiber) >= 2:
                found[tuple(sorted(fiber))] = name
    return found
