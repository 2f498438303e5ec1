"""The straggler detector (runtime.stragglers) on real runs of tiny-gpt on 4 CPU ranks (gloo):
its false-positive rate on undisturbed runs and its detection latency with one rank slowed.

- Undisturbed: ``planner run --steps 200``; every rank named is a false positive. The rate is
  named ranks over the rank-windows judged (the report's ``straggler_checks``).
- Slowed: ``--inject-fault 2,SLOW_FROM,slow`` (from that step on, rank 2 sleeps at
  each step's start as long as its fastest step took, at least runtime.heartbeat.SLOW_FAULT_S);
  the latency is the steps it ran slowed until named,
  ``named_at_step - SLOW_FROM + 1``; naming another rank, or none, is a miss.

Each report keeps every step's timings (``timing_windows``), so the benchmark also judges the
same runs again offline with other thresholds (``ALTERNATIVES``), to show what the defaults trade.

With ``--links``, the slow-link detector (``runtime.slow_links``) instead, on tiny-gpt tp2 x dp2
(two tp groups, two dp groups): undisturbed runs, where every link named is a false positive
(the rate over the group-windows judged, ``link_checks``), and runs with the link between ranks 0
and 1 slowed (``--inject-fault 0,SLOW_FROM,slow-link,1``: their tp group's collectives each sleep
``runtime.run.SLOW_LINK_FAULT_S``), whose latency is the steps it ran slowed until named; naming
another link, or none, is a miss, and any rank named is counted too (``LINK_ALTERNATIVES``).

With ``--links --netns-rate-mbit R`` (root, iproute2), a real slow link: each rank on a host of its
own (``scripts/netns_hosts.py``, one torchrun per host), the link between hosts 0 and 1 limited
to R Mbit/s by tc from the start; the benchmark prints what was named and after how many judged
steps (its first window's first step on).

Run: .venv/bin/python benchmarks/straggler_detection.py --cluster cluster.json [--repeats 2] [--links]
(a profile of this machine as 4 ranks: ``planner profile --quick`` under torchrun makes one).
"""

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from planner.schemas import RunReport
from runtime.slow_links import GroupWaits, LinkSettings, LinkState, observe_links
from runtime.stragglers import DetectorSettings, DetectorState, WindowTimings, observe, peer_groups

SLOW_RANK, SLOW_FROM = 2, 20
UNDISTURBED_STEPS, SLOWED_STEPS = 200, 60
DEFAULT = DetectorSettings()
ALTERNATIVES = {
    "default": DEFAULT,
    "excess > 30%": replace(DEFAULT, min_excess_fraction=0.3),
    "excess > 100%": replace(DEFAULT, min_excess_fraction=1.0),
    "2 windows": replace(DEFAULT, windows_to_flag=2),
    "noise x 3": replace(DEFAULT, mad_factor=3.0),
    "4 steps x 2": replace(DEFAULT, window_steps=4, windows_to_flag=2),
    "4 steps x 3": replace(DEFAULT, window_steps=4, windows_to_flag=3),
    "4-1 steps x 3": replace(DEFAULT, window_steps=4, outlier_steps=1, windows_to_flag=3),
}
"""Thresholds and windows judged offline on the same timings (steps regrouped into windows)."""
SLOW_LINK: tuple[int, ...] = (0, 1)
LINK_DEFAULT = LinkSettings()
LINK_ALTERNATIVES = {
    "default": LINK_DEFAULT,
    "excess > 50%": replace(LINK_DEFAULT, min_excess_fraction=0.5),
    "excess > 2 ms": replace(LINK_DEFAULT, min_excess_s=2e-3),
    "2 windows": replace(LINK_DEFAULT, windows_to_flag=2),
    "1 window": replace(LINK_DEFAULT, windows_to_flag=1),
}
"""Slow-link thresholds judged offline on the same timings (the rank detector's windows)."""


def judge(report: RunReport, settings: DetectorSettings) -> tuple[list[tuple[int, int]], int]:
    """The (rank, named_at_step) the detector names in ``report``'s timings under ``settings``,
    and the rank-windows it judged."""
    if report.layout.pipeline_parallel_degree != 1:
        raise SystemExit(f"the plan has a pipeline ({report.layout.describe()}): compare its stages' ranks apart")
    world = report.world_size
    groups = peer_groups([0] * world)
    first = report.timing_windows[0].first_step if report.timing_windows else 0
    compute = [step for w in report.timing_windows for step in w.compute_s]
    wait = [step for w in report.timing_windows for step in w.wait_s]
    k = settings.window_steps
    state = DetectorState.empty(world)
    named: list[tuple[int, int]] = []
    for start in range(0, len(compute) - k + 1, k):
        window = WindowTimings(
            first_step=first + start, compute_s=tuple(compute[start : start + k]), wait_s=tuple(wait[start : start + k])
        )
        state, findings = observe(state, window, groups, settings)
        named += [(f.rank, f.named_at_step) for f in findings]
    return named, state.checks


def judge_links(report: RunReport, settings: LinkSettings) -> tuple[list[tuple[tuple[int, ...], int]], int]:
    """The (link, named_at_step) the slow-link detector names in ``report``'s timings under
    ``settings`` (windows as the run had them), and the group-windows it judged."""
    stages = [0] * report.world_size
    state = LinkState()
    named: list[tuple[tuple[int, ...], int]] = []
    for w in report.timing_windows:
        waits = tuple(GroupWaits(ranks=g.ranks, wait_s=g.wait_s) for g in w.groups)
        state, findings = observe_links(
            state,
            first_step=w.first_step,
            compute_s=w.compute_s,
            waits=waits,
            stage_of_rank=stages,
            peers=peer_groups(stages),
            settings=settings,
            ranks=DEFAULT,
        )
        named += [(f.ranks, f.named_at_step) for f in findings]
    return named, state.checks


S = TypeVar("S")
"""A detector's settings."""
T = TypeVar("T")
"""What it names: a rank, or a link's ranks."""


def thresholds_table(
    alternatives: dict[str, S],
    judge_run: Callable[[RunReport, S], tuple[list[tuple[T, int]], int]],
    quiet: Sequence[RunReport],
    slowed: Sequence[RunReport],
    target: T,
    checks_name: str,
    named_kind: str,
) -> None:
    """One row per set of thresholds: what it names on the undisturbed runs (false positives, out
    of the windows it judged) and after how many steps of the fault it names ``target`` in each
    slowed run (with anything else it names there)."""
    width = len(checks_name)
    header = f"{'thresholds':<14} {'false pos.':>10} {checks_name:>{width}} {'FP rate':>8}"
    print(f"{header}   latency (steps) per slowed run")
    for name, settings in alternatives.items():
        verdicts = [judge_run(r, settings) for r in quiet]
        false = sum(len(named) for named, _ in verdicts)
        checks = sum(checks for _, checks in verdicts)
        latencies = []
        for r in slowed:
            named, _ = judge_run(r, settings)
            hit = [step for who, step in named if who == target and step >= SLOW_FROM]
            wrong = [who for who, _ in named if who != target]
            latencies.append(
                (f"{hit[0] - SLOW_FROM + 1}" if hit else "missed") + (f" (+{named_kind} {wrong})" if wrong else "")
            )
        print(f"{name:<14} {false:>10} {checks:>{width}} {false / max(checks, 1):>8.3f}   {', '.join(latencies)}")


def links(cluster: str, repeats: int, workdir: Path, netns_rate_mbit: float | None) -> None:
    """The slow-link detector's false positives and latency (see the module docstring)."""
    plan = workdir / "plan-tp2.json"
    search = [sys.executable, "-m", "planner", "search", "-m", "tiny-gpt", "-c", cluster, "--tp", "2", "--dp", "2"]
    search += ["--global-batch-size", "4", "--seq-len", "16", "--output", str(plan)]
    subprocess.run(search, check=True, capture_output=True)
    if netns_rate_mbit is not None:
        links_over_netns(plan, netns_rate_mbit, repeats, workdir)
        return
    quiet = [run(plan, UNDISTURBED_STEPS, workdir / f"links-quiet{i}.json", None) for i in range(repeats)]
    fault = f"{SLOW_LINK[0]},{SLOW_FROM},slow-link,{SLOW_LINK[1]}"
    slowed = [run(plan, SLOWED_STEPS, workdir / f"links-slow{i}.json", fault) for i in range(repeats)]
    step_s = sorted(r.measured_step_time_s for r in quiet)[len(quiet) // 2]
    print(f"tiny-gpt {quiet[0].layout.describe()} on 4 CPU ranks, {step_s * 1e3:.0f} ms a step; reports in {workdir}")
    thresholds_table(LINK_ALTERNATIVES, judge_links, quiet, slowed, SLOW_LINK, "group-windows", "links")
    live = [(len(r.slow_links), len(r.stragglers)) for r in quiet]
    live_slowed = [
        ([(s.ranks, s.named_at_step - SLOW_FROM + 1) for s in r.slow_links], [s.rank for s in r.stragglers])
        for r in slowed
    ]
    print(f"named live (default thresholds): undisturbed (links, ranks) per run {live}")
    print(f"slowed ([(link, latency)], ranks) per run {live_slowed}")


def links_over_netns(plan: Path, rate_mbit: float, repeats: int, workdir: Path) -> None:
    """Runs of ``plan`` on 4 namespaced hosts with the link between hosts 0 and 1 limited to
    ``rate_mbit``: what was named, and when."""
    import netns_profile  # beside this script: the namespaced hosts and a torchrun per host

    if reason := netns_profile.netns_hosts.unavailable_reason():
        raise SystemExit(f"--netns-rate-mbit: {reason}")
    print(f"4 namespaced hosts, one rank each, link 0-1 limited to {rate_mbit:g} Mbit/s from the start")
    for i in range(repeats):
        report_path = workdir / f"links-netns{i}.json"
        with netns_profile.netns_hosts.NetnsHosts(4, {(0, 1): rate_mbit}) as hosts:
            argv = ["run", str(plan), "--steps", str(SLOWED_STEPS), "--report", str(report_path)]
            netns_profile.torchrun_across(hosts, argv, timeout_s=900)
        r = RunReport.model_validate_json(report_path.read_text())
        first = r.timing_windows[0].first_step if r.timing_windows else 0
        by_group: dict[tuple[int, ...], list[float]] = {}
        for w in r.timing_windows:
            for g in w.groups:
                by_group.setdefault(g.ranks, []).extend(min(step) for step in g.wait_s)
        waits = {g: f"{sorted(v)[len(v) // 2] * 1e3:.1f}" for g, v in sorted(by_group.items())}
        named = [(s.ranks, s.hosts, s.named_at_step - first + 1) for s in r.slow_links]
        print(f"run {i}: {r.measured_step_time_s * 1e3:.0f} ms a step; median least wait a step per group (ms) {waits}")
        ranks = [s.rank for s in r.stragglers]
        print(f"  links named (ranks, hosts, judged steps until named) {named}; ranks named {ranks}")


def run(plan: Path, steps: int, report: Path, fault: str | None) -> RunReport:
    """One ``planner run`` of ``plan`` on 4 ranks; its report."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    command += ["-m", "planner", "run", str(plan), "--steps", str(steps), "--report", str(report)]
    command += ["--inject-fault", fault] if fault else []
    subprocess.run(command, check=True, capture_output=True, cwd=report.parent)
    return RunReport.model_validate_json(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cluster", required=True, help="a profile of this machine as 4 ranks")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each kind")
    parser.add_argument("--links", action="store_true", help="judge the slow-link detector instead")
    parser.add_argument("--netns-rate-mbit", type=float, help="with --links: a link slowed by tc on namespaced hosts")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="stragglers-"))
    if args.links:
        links(args.cluster, args.repeats, workdir, args.netns_rate_mbit)
        return
    plan = workdir / "plan.json"
    search = [sys.executable, "-m", "planner", "search", "-m", "tiny-gpt", "-c", args.cluster]
    search += ["--global-batch-size", "8", "--seq-len", "32", "--output", str(plan)]
    subprocess.run(search, check=True, capture_output=True)
    quiet = [run(plan, UNDISTURBED_STEPS, workdir / f"quiet{i}.json", None) for i in range(args.repeats)]
    fault = f"{SLOW_RANK},{SLOW_FROM},slow"
    slowed = [run(plan, SLOWED_STEPS, workdir / f"slow{i}.json", fault) for i in range(args.repeats)]
    layout = quiet[0].layout.describe()
    step_s = sorted(r.measured_step_time_s for r in quiet)[len(quiet) // 2]
    print(f"tiny-gpt {layout} on 4 CPU ranks, {step_s * 1e3:.0f} ms a step undisturbed; reports in {workdir}")
    thresholds_table(ALTERNATIVES, judge, quiet, slowed, SLOW_RANK, "rank-windows", "ranks")
    live = sum(len(r.stragglers) for r in quiet)
    live_slowed = [[(s.rank, s.named_at_step - SLOW_FROM + 1) for s in r.stragglers] for r in slowed]
    print(f"named live (default thresholds): undisturbed {live}; slowed (rank, latency) {live_slowed}")


if __name__ == "__main__":
    main()
