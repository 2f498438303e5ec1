"""The straggler detector (runtime.stragglers) on real runs of tiny-gpt on 4 CPU ranks (gloo):
its false-positive rate on undisturbed runs and its detection latency with one rank slowed.

- Undisturbed: ``planner run --steps 200``; every rank named is a false positive. The rate is
  named ranks over the rank-windows judged (the report's ``straggler_checks``).
- Slowed: ``--inject-fault 2,SLOW_FROM,slow`` (rank 2 sleeps runtime.heartbeat.SLOW_FAULT_S in
  each forward pass from that step on); the latency is the steps it ran slowed until named,
  ``named_at_step - SLOW_FROM + 1``; naming another rank, or none, is a miss.

Each report keeps every step's timings (``timing_windows``), so the benchmark also judges the
same runs again offline with other thresholds (``ALTERNATIVES``), to show what the defaults trade.

Run: .venv/bin/python benchmarks/straggler_detection.py --cluster cluster.json [--repeats 2]
(a profile of this machine as 4 ranks: ``planner profile --quick`` under torchrun makes one).
"""

import argparse
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from planner.schemas import RunReport
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
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="stragglers-"))
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
    print(f"{'thresholds':<14} {'false pos.':>10} {'rank-windows':>12} {'FP rate':>8}   latency (steps) per slowed run")
    for name, settings in ALTERNATIVES.items():
        verdicts = [judge(r, settings) for r in quiet]
        false = sum(len(named) for named, _ in verdicts)
        checks = sum(checks for _, checks in verdicts)
        latencies = []
        for r in slowed:
            named, _ = judge(r, settings)
            hit = [step for rank, step in named if rank == SLOW_RANK and step >= SLOW_FROM]
            wrong = [rank for rank, _ in named if rank != SLOW_RANK]
            latencies.append(
                (f"{hit[0] - SLOW_FROM + 1}" if hit else "missed") + (f" (+ranks {wrong})" if wrong else "")
            )
        print(f"{name:<14} {false:>10} {checks:>12} {false / checks:>8.3f}   {', '.join(latencies)}")
    live = sum(len(r.stragglers) for r in quiet)
    live_slowed = [[(s.rank, s.named_at_step - SLOW_FROM + 1) for s in r.stragglers] for r in slowed]
    print(f"named live (default thresholds): undisturbed {live}; slowed (rank, latency) {live_slowed}")


if __name__ == "__main__":
    main()
