"""Slow-link detection: which link between ranks is slower than the links carrying the same traffic,
from the time each rank spends inside each process group's collectives. Pure functions;
``runtime.straggler_watch`` measures and exchanges the timings.

A process group's collectives hold all its members until the slowest transfer among them is done,
so a slow link inside a group makes *every* member wait longer in that group's collectives,
while their compute does not change. A straggling rank differs: it makes the others wait for it,
but waits no longer itself, so the least wait among a group's members stays level. This module
therefore takes, per step, a group's *wait* as the least of its members' time inside it.

Groups along one axis of the mesh carry the same traffic each step (the tensor-parallel groups
of different replicas, the data-parallel groups of different tensor ranks): their *siblings*,
found from the groups' shapes (``sibling_families``: groups of the same rank offsets and the
same pipeline stages are translates of one another along the mesh). A group's excess in a step
is its wait minus the median of its siblings'; its excess in a window the least of its steps'
once the ``outlier_steps`` least are set aside (as ``runtime.stragglers`` does for compute). A
group is *out* in a window when that excess is more than both ``min_excess_fraction`` of the
siblings' median wait and ``min_excess_s``, and none of its members computes far longer than
its pipeline-stage peers in that window (``runtime.stragglers.is_out``, its noise rule aside:
the member would be a straggler, not its link). A group out in ``windows_to_flag`` consecutive
windows is a slow link finding.

The link named: in a group of two, its two members. In a larger group, the members it shares
with the other groups out at the same time that overlap it in two or more ranks (a link lies in
every group holding both its ends), when exactly two remain; else the whole group.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.stragglers import DetectorSettings, excess_s, is_out

GroupKey = tuple[int, ...]
"""A process group's global ranks, sorted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSettings:
    """How slow links are judged (windows are the rank detector's, ``DetectorSettings.window_steps``)."""

    outlier_steps: int = 0
    """Steps of a window whose excess is set aside (the least ones)."""
    windows_to_flag: int = 3
    """Consecutive windows a group must be out to be named."""
    min_excess_fraction: float = 1.0
    """Least excess over the siblings' median wait, as a fraction of it."""
    min_excess_s: float = 5e-3
    """Least excess in seconds a step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupWaits:
    """One process group's members' time inside its collectives over a window."""

    ranks: GroupKey
    wait_s: tuple[tuple[float, ...], ...]
    """Per step of the window, per member (in ``ranks``' order): seconds inside the group's collectives."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFinding:
    """A link named slow."""

    ranks: tuple[int, ...]
    """Its ends (two ranks), or the whole group when the link could not be narrowed down."""
    group: GroupKey
    """The group whose collectives showed it."""
    since_step: int
    named_at_step: int
    wait_s: float
    """The group's median wait a step (least over its members) in the window that named it."""
    siblings: tuple[GroupKey, ...]
    siblings_wait_s: float
    """The siblings' median wait a step in that window."""

    @property
    def is_pair(self) -> bool:
        return len(self.ranks) == 2


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkState:
    """What the detector remembers between windows, per group."""

    streaks: tuple[tuple[GroupKey, tuple[int, ...]], ...] = ()
    """Per group out in the last window: the first steps of the consecutive windows it was out in."""
    named: frozenset[GroupKey] = frozenset()
    checks: int = 0
    """Group-windows judged so far (the false-positive rate's denominator)."""


def shape(group: GroupKey, stage_of_rank: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What makes groups siblings: their members' offsets from the first, and their stages."""
    return tuple(r - group[0] for r in group), tuple(stage_of_rank[r] for r in group)


def sibling_families(groups: Sequence[GroupKey], stage_of_rank: Sequence[int]) -> tuple[tuple[GroupKey, ...], ...]:
    """The groups of two or more members that have siblings, in families of the same shape
    (disjoint translates along the mesh: the same traffic each step), families and groups sorted."""
    by_shape: dict[tuple[tuple[int, ...], tuple[int, ...]], set[GroupKey]] = {}
    for group in groups:
        if len(group) >= 2:
            by_shape.setdefault(shape(group, stage_of_rank), set()).add(group)
    families = [tuple(sorted(family)) for family in by_shape.values() if len(family) >= 2]
    return tuple(sorted(f for f in families if _disjoint(f)))


def _disjoint(family: Sequence[GroupKey]) -> bool:
    members = [r for group in family for r in group]
    return len(members) == len(set(members))


def group_wait_s(waits: GroupWaits) -> tuple[float, ...]:
    """Per step, the least of the members' waits: what a link held all of them for."""
    return tuple(min(step) for step in waits.wait_s)


def _straggling(
    group: GroupKey, compute_s: Sequence[Sequence[float]], peers: Sequence[Sequence[int]], ranks: DetectorSettings
) -> bool:
    """Whether a member computed far longer than its stage peers in the window (its noise aside)."""
    for rank in group:
        if not peers[rank]:
            continue
        peers_compute = statistics.median(statistics.median(step[p] for p in peers[rank]) for step in compute_s)
        if is_out(excess_s(compute_s, peers[rank], rank, ranks.outlier_steps), peers_compute, (), ranks):
            return True
    return False


def observe_links(
    state: LinkState,
    *,
    first_step: int,
    compute_s: Sequence[Sequence[float]],
    waits: Sequence[GroupWaits],
    stage_of_rank: Sequence[int],
    peers: Sequence[Sequence[int]],
    settings: LinkSettings,
    ranks: DetectorSettings,
) -> tuple[LinkState, tuple[LinkFinding, ...]]:
    """Judge one window; the new state and the links named in it (each group's once).

    Args:
        state: the state after the previous window (``LinkState()`` at first).
        first_step: the window's first step.
        compute_s: per step of the window, per rank: time outside collectives.
        waits: per group seen in the window, its members' waits.
        stage_of_rank: every rank's pipeline stage.
        peers: per rank, its stage peers (``runtime.stragglers.peer_groups``).
        settings: the link thresholds; ``ranks``: the rank detector's (for the members' compute).
    """
    by_group = {w.ranks: group_wait_s(w) for w in waits}
    last_step = first_step + len(compute_s) - 1
    old = dict(state.streaks)
    streaks: dict[GroupKey, tuple[int, ...]] = {}
    checks = state.checks
    context: dict[GroupKey, tuple[float, tuple[GroupKey, ...], float]] = {}
    for family in sibling_families(list(by_group), stage_of_rank):
        for group in family:
            siblings = tuple(g for g in family if g != group)
            checks += 1
            steps = range(len(by_group[group]))
            excesses = sorted(by_group[group][i] - statistics.median(by_group[g][i] for g in siblings) for i in steps)
            excess = excesses[min(settings.outlier_steps, len(excesses) - 1)]
            siblings_wait = statistics.median(statistics.median(by_group[g][i] for g in siblings) for i in steps)
            threshold = max(settings.min_excess_fraction * siblings_wait, settings.min_excess_s)
            if excess > threshold and not _straggling(group, compute_s, peers, ranks):
                streaks[group] = (*old.get(group, ()), first_step)
                context[group] = (statistics.median(by_group[group]), siblings, siblings_wait)
    named = [g for g, s in streaks.items() if len(s) >= settings.windows_to_flag and g not in state.named]
    findings = tuple(
        LinkFinding(
            ranks=link_ends(group, list(streaks)),
            group=group,
            since_step=streaks[group][0],
            named_at_step=last_step,
            wait_s=context[group][0],
            siblings=context[group][1],
            siblings_wait_s=context[group][2],
        )
        for group in sorted(named)
    )
    new_state = LinkState(streaks=tuple(sorted(streaks.items())), named=state.named | set(named), checks=checks)
    return new_state, findings


def link_ends(group: GroupKey, out: Sequence[GroupKey]) -> tuple[int, ...]:
    """The link a slow group points at (see the module docstring): its two members, or those it
    shares with the other out groups overlapping it in two or more, or the whole group."""
    if len(group) == 2:
        return group
    shared = set(group)
    for other in out:
        if other != group and len(shared & set(other)) >= 2:
            shared &= set(other)
    return tuple(sorted(shared)) if len(shared) == 2 else group


def describe_link(finding: LinkFinding, hosts: Sequence[str], axis: str = "") -> str:
    """One line naming the link, its ends' hosts and what its siblings saw; ``axis`` names the
    group's mesh axis, where known."""
    if finding.is_pair:
        a, b = finding.ranks
        where = f"slow link between rank {a} (host {hosts[a]}) and rank {b} (host {hosts[b]})"
    else:
        members = ", ".join(f"{r} ({hosts[r]})" for r in finding.ranks)
        where = f"slow link inside the group of ranks {members}"
    group = ",".join(str(r) for r in finding.group)
    return (
        f"{where} since step {finding.since_step}: its {axis + ' ' if axis else ''}group (ranks {group}) waits "
        f"{finding.wait_s * 1e3:.1f} ms a step in its collectives against {finding.siblings_wait_s * 1e3:.1f} ms "
        f"on its sibling groups"
    )
