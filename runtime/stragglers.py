"""Straggler detection: which rank is slower than the ranks doing the same work, from timings
each rank takes of itself. Pure functions; ``runtime.run`` measures and exchanges the timings.

A straggler makes its peers wait for it inside the collectives they share, so its time outside
collectives (its *compute*) grows while its time inside them (its *wait*) does not; its peers
show the opposite: their compute is unchanged and their wait grows by the straggler's delay.
Step time alone cannot tell who is slow (every rank leaves the step's last collective together);
compute can. C4 (Dong et al., HPCA 2025) rests on the same observation: collectives are periodic
and homogeneous, so a rank that departs from its peers is a fault.

Each rank sums its time inside collectives per step (``runtime.collective_clock``); compute is the
step's wall time minus that. Every ``window_steps`` steps the ranks exchange the window's compute
and wait (one object all-gather, ``runtime.straggler_watch``) and every rank judges them alike
(``observe``), so all reach the same verdict at the same step without further messages.

A rank's *excess* in a step is its compute minus the median of its peers' (the other ranks of its
pipeline stage, ``peer_groups``) in that step, and its excess in a window the least of its
steps' once the ``outlier_steps`` least are set aside: a rank descheduled in some steps (a busy
host, a garbage collection) is not a straggler, one slower than its peers in (almost) every step
is; setting a step aside lets a straggler through a step in which a peer was slowed too. A rank
is *out* in a window when that excess is more than each of

- ``min_excess_fraction`` of that median (a slowdown worth naming),
- ``mad_factor`` times its own noise: 1.4826 MAD of its excess over the last ``baseline_windows``
  windows in which it was not out (the rolling baseline; a noisy rank needs a larger departure),
- ``min_excess_s`` (timer resolution and scheduler jitter on very short steps),

and it is named once it is out in ``windows_to_flag`` consecutive windows. Ranks alone in their
stage have no peers and are not judged.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MAD_TO_SIGMA = 1.4826
"""The median absolute deviation times this estimates a normal distribution's standard deviation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorSettings:
    """How the detector judges. The defaults are the best of those benchmarks/straggler_detection.py
    judged on 4 ranks of tiny-gpt sharing 2 busy cores (no false positive in 2,884 rank-windows of
    11 undisturbed runs of 200 steps; a rank slowed 2x named after 9-12 steps in 10 runs of 11,
    after 33 in the eleventh): a noisy host, where one rank in four is often 50% slower for a few
    steps."""

    window_steps: int = 3
    """Steps per window: the ranks exchange their timings once a window."""
    outlier_steps: int = 0
    """Steps of a window whose excess is set aside (the least ones). With 1 (and windows of 4
    steps) the benchmark's slowed rank was named also under a load that hid it from the
    defaults, but after 14 steps instead of 9 and with a wrong rank named once."""
    windows_to_flag: int = 3
    """Consecutive windows a rank must be out to be named."""
    min_excess_fraction: float = 0.6
    """Least excess over the peers' median compute, as a fraction of it."""
    mad_factor: float = 0.0
    """Least excess in units of the rank's own noise (1.4826 MAD of its baseline excesses); off
    by default: on the benchmark's host it missed slowed ranks and spared no false positive (a
    few windows of a noisy rank make a noisy estimate)."""
    min_excess_s: float = 2e-3
    """Least excess in seconds."""
    baseline_windows: int = 16
    """Windows of a rank's past excesses its noise is estimated from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowTimings:
    """Every rank's timings in one window of steps."""

    first_step: int
    compute_s: tuple[tuple[float, ...], ...]
    """Per step of the window, per rank: time outside collectives."""
    wait_s: tuple[tuple[float, ...], ...]
    """Per step of the window, per rank: time inside collectives."""

    @property
    def last_step(self) -> int:
        return self.first_step + len(self.compute_s) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A rank named a straggler."""

    rank: int
    since_step: int
    """First step of the first of the consecutive windows it was out in."""
    named_at_step: int
    compute_s: float
    """Its median compute a step in the window that named it."""
    peers: tuple[int, ...]
    peers_compute_s: float
    """Its peers' median compute a step in that window."""
    peers_wait_s: float
    """Its peers' median wait a step in that window."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorState:
    """What the detector remembers between windows, per rank."""

    baselines: tuple[tuple[float, ...], ...]
    """The rank's excesses over its peers in its last windows in which it was not out."""
    streaks: tuple[tuple[int, ...], ...]
    """First steps of the consecutive windows (up to now) the rank was out in."""
    named: frozenset[int] = frozenset()
    checks: int = 0
    """Rank-windows judged so far (the false-positive rate's denominator)."""

    @classmethod
    def empty(cls, world_size: int) -> "DetectorState":
        return cls(baselines=((),) * world_size, streaks=((),) * world_size)


def peer_groups(stage_of_rank: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Per rank, the other ranks doing the same work: those of its pipeline stage.

    Ranks of one stage run the same layers on the same amount of data (tensor, data, expert and
    context parallel splits are even), so their compute should match; different stages need not.
    """
    return tuple(
        tuple(p for p, s in enumerate(stage_of_rank) if s == stage and p != r) for r, stage in enumerate(stage_of_rank)
    )


def noise_s(baseline: Sequence[float]) -> float:
    """1.4826 MAD of a rank's past excesses (0 with fewer than 3: too few to estimate)."""
    if len(baseline) < 3:
        return 0.0
    centre = statistics.median(baseline)
    return MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in baseline)


def excess_s(compute_s: Sequence[Sequence[float]], peers: Sequence[int], rank: int, outlier_steps: int = 0) -> float:
    """How much longer ``rank`` computed than the median of ``peers`` in every step of a window
    (``compute_s`` per step, per rank) but its ``outlier_steps`` least: the least of the others'
    excesses."""
    excesses = sorted(step[rank] - statistics.median(step[p] for p in peers) for step in compute_s)
    return excesses[min(outlier_steps, len(excesses) - 1)]


def _median_over(values_s: Sequence[Sequence[float]], ranks: Sequence[int]) -> float:
    """The median over a window's steps of the median over ``ranks``."""
    return statistics.median(statistics.median(step[p] for p in ranks) for step in values_s)


def is_out(excess: float, peers_compute_s: float, baseline: Sequence[float], settings: DetectorSettings) -> bool:
    """Whether an excess over the peers' median compute departs (see the module docstring)."""
    threshold = max(
        settings.min_excess_fraction * peers_compute_s,
        settings.mad_factor * noise_s(baseline),
        settings.min_excess_s,
    )
    return excess > threshold


def observe(
    state: DetectorState,
    window: WindowTimings,
    groups: Sequence[Sequence[int]],
    settings: DetectorSettings,
) -> tuple[DetectorState, tuple[Finding, ...]]:
    """Judge one window; the new state and the ranks named in it (each rank is named once).

    Args:
        state: the state after the previous window (``DetectorState.empty`` at first).
        window: every rank's median compute and wait over the window, in seconds.
        groups: per rank, its peers (``peer_groups``).
        settings: the thresholds.
    """
    baselines = list(state.baselines)
    streaks = list(state.streaks)
    findings: list[Finding] = []
    checks = state.checks
    for rank, peers in enumerate(groups):
        if not peers:
            continue
        checks += 1
        excess = excess_s(window.compute_s, peers, rank, settings.outlier_steps)
        peers_compute = _median_over(window.compute_s, peers)
        if is_out(excess, peers_compute, baselines[rank], settings):
            streaks[rank] = (*streaks[rank], window.first_step)
        else:
            streaks[rank] = ()
            baselines[rank] = (*baselines[rank], excess)[-settings.baseline_windows :]
        if len(streaks[rank]) >= settings.windows_to_flag and rank not in state.named:
            findings.append(
                Finding(
                    rank=rank,
                    since_step=streaks[rank][0],
                    named_at_step=window.last_step,
                    compute_s=_median_over(window.compute_s, [rank]),
                    peers=tuple(peers),
                    peers_compute_s=peers_compute,
                    peers_wait_s=_median_over(window.wait_s, peers),
                )
            )
    named = state.named | {f.rank for f in findings}
    new_state = DetectorState(baselines=tuple(baselines), streaks=tuple(streaks), named=named, checks=checks)
    return new_state, tuple(findings)


def describe(finding: Finding, hosts: Sequence[str]) -> str:
    """One line naming the straggler, its host and what its peers saw."""
    peers = ",".join(str(p) for p in finding.peers)
    return (
        f"rank {finding.rank} on host {hosts[finding.rank]} is a straggler since step {finding.since_step}: "
        f"{finding.compute_s * 1e3:.1f} ms a step outside collectives against {finding.peers_compute_s * 1e3:.1f} ms "
        f"for its peers (ranks {peers}), who waited {finding.peers_wait_s * 1e3:.1f} ms a step in collectives"
    )
