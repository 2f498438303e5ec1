"""The model against the local 4-rank CPU cluster: run 12 distinct plans of tiny-gpt for real
and report how right the model was, before calibration and after it (leave-one-out: each plan
is predicted by factors fitted on the other plans only). Keep the machine otherwise idle: the
plans share its cores.

Targets: Spearman >= 0.9 and top-1 regret <= 5% before calibration; median step-time
and per-rank memory errors <= 10% after calibration, on plans not used for fitting.

The machine's own noise bounds what any model can score: with --passes 2 (the default) every
measured plan runs once more, in reverse order, and the benchmark reports how well the two
passes agree with each other (their Spearman is the ceiling for the model's), and the model's
figures against the mean of the passes.

Run: .venv/bin/python benchmarks/tune_local.py [--cluster out/cluster.json] [--top-k 12] [--passes 2]
(without --cluster it profiles the machine first, as the README's main job does). Writes
out/tune-bench/ (plans, reports, logs, validation.png) and a fresh study in it.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
from rich.console import Console
from scipy.stats import spearmanr

from planner import api
from planner.schemas import TrainingSpec
from planner.schemas.settings import Selection, TuneSettings
from planner.tuning.launcher import TrialFiles
from planner.tuning.tuner import TuneResult, measured_observations, run_trial_job
from planner.tuning.validate import after_calibration, before_calibration
from planner.views.tune_plot import save_plot
from planner.views.tune_tables import factors_table, trials_table, validation_table

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)


def main() -> None:
    """Profile (unless given a profile), tune, print the figures against the targets."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="a profile of this machine as 4 ranks (default: measure one)")
    parser.add_argument("--top-k", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--passes", type=int, choices=(1, 2), default=2, help="2: run every plan again")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workdir = Path("out/tune-bench")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cluster = args.cluster or str(workdir / "cluster.json")
    if args.cluster is None:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
        profile = ["-m", "planner", "profile", "--output", cluster, "--quick", "--model", "tiny-gpt"]
        profile += ["--seq-len", "128", "--dtype", "bf16"]
        subprocess.run([*torchrun, *profile], check=True, capture_output=True)
    settings = TuneSettings(
        top_k=args.top_k,
        select=Selection.SPREAD,
        steps=args.steps,
        storage=f"sqlite:///{workdir / 'tune.db'}",
        workdir=workdir,
    )
    start = time.perf_counter()
    result = api.tune("tiny-gpt", cluster, TRAINING, replace(settings, calibrate=False))
    elapsed = time.perf_counter() - start
    console = Console(width=160)
    console.print(trials_table(result.records))
    assert result.before is not None and result.after is not None and result.calibration is not None
    console.print(validation_table([result.before, result.after]))
    console.print(factors_table(result.calibration))
    save_plot([result.before, result.after], workdir / "validation.png")
    before, after = result.before, result.after
    checks = [
        ("Spearman before calibration >= 0.9", before.spearman, before.spearman >= 0.9),
        ("top-1 regret before calibration <= 1.05", before.top1_regret, before.top1_regret <= 1.05),
        ("median step-time error after (held out) <= 10%", after.median_time_error, after.median_time_error <= 0.10),
        (
            "median per-rank memory error after (held out) <= 10%",
            after.median_memory_error,
            after.median_memory_error is not None and after.median_memory_error <= 0.10,
        ),
    ]
    print(f"{len(result.measured)} of {len(result.records)} plans measured in {elapsed:.0f} s")
    for name, value, ok in checks:
        print(f"  {'met    ' if ok else 'NOT met'}  {name}: {value:.3f}" if value is not None else f"  n/a  {name}")
    print(f"plot: {workdir / 'validation.png'}")
    if args.passes == 2:
        second_pass(result, cluster, settings, console)


def second_pass(result: TuneResult, cluster: str, settings: TuneSettings, console: Console) -> None:
    """Run every measured plan again, last first; print how the passes agree, and the model
    against their mean."""
    again: dict[str, float] = {}
    workdir = settings.workdir / "pass2"
    workdir.mkdir(parents=True, exist_ok=True)
    for record in reversed(result.measured):
        files = TrialFiles.in_dir(workdir, record.key)
        api.save_plan(record.plan, files.plan)
        run = run_trial_job(record.plan, files, settings)
        if run.report is not None:
            again[record.key] = run.report.measured_step_time_s
    both = [r for r in result.measured if r.key in again]
    observed = measured_observations(both)
    first = [obs.measured_step_time_s for obs in observed]
    second = [again[r.key] for r in both]
    differences = [abs(a - b) / ((a + b) / 2) for a, b in zip(first, second, strict=True)]
    print(f"\nsecond pass: {len(both)} plans run again, last first")
    print(f"  the passes' own Spearman (the ceiling for the model's): {spearmanr(first, second).statistic:.3f}")
    print(f"  step time, pass 1 vs pass 2: median difference {statistics.median(differences):.1%}, "
          f"worst {max(differences):.1%}")  # fmt: skip
    mean = [replace(obs, measured_step_time_s=(a + b) / 2) for obs, a, b in zip(observed, first, second, strict=True)]
    profile = api.load_cluster(cluster)
    before = replace(before_calibration(mean, profile), title="uncalibrated, vs the mean of the passes")
    after = replace(after_calibration(mean, profile)[0], title="calibrated, held out, vs the mean")
    console.print(validation_table([before, after]))


if __name__ == "__main__":
    main()
