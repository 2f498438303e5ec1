"""`planner tune`: run the search's best plans for real, keep every trial, learn from them.

The pieces that ``planner.api.tune`` composes: the top-k plans of the search run one by one as
jobs (planner.tuning.launcher); each run is a trial of an Optuna study (planner.tuning.study), so
a tuner that is stopped resumes where it was and never runs a finished plan twice. From the
measured plans it fits the cluster's Calibration and judges the model before and after it
(planner.tuning.validate).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.files.plans import save_plan
from planner.schemas import Calibration, ClusterProfile, Plan
from planner.schemas.errors import SchemaError
from planner.schemas.settings import TuneSettings
from planner.search_engine.strategy import Progress
from planner.tuning.calibrate import DEFAULT_PRIOR_WEIGHT, Observation, fit_calibration
from planner.tuning.launcher import TrialFiles, TrialRun, job_command, run_job
from planner.tuning.study import TrialRecord, finish_trial, finished_keys, open_study, plan_key, records, start_trial
from planner.tuning.validate import (
    Validation,
    after_calibration,
    before_calibration,
    improves_memory,
    improves_time,
    with_memory_of,
    with_time_of,
)

MIN_PLANS_FOR_HELD_OUT = 3
"""Measured plans needed before the calibrated figures are reported (each is left out once)."""


RunTrial = Callable[[Plan, TrialFiles, TuneSettings], TrialRun]
"""Runs one plan (its plan file written, its report and log to come); the default starts the job."""


def run_trial_job(plan: Plan, files: TrialFiles, settings: TuneSettings) -> TrialRun:
    """Run the plan's job with the settings' launcher and time limit."""
    command = job_command(plan, files.plan, files.report, settings.steps, settings.launcher)
    return run_job(command, files.report, files.log, settings.trial_timeout_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult:
    """The study's trials, what this tuner ran, and what they taught."""

    study_name: str
    records: tuple[TrialRecord, ...]
    """Every finished trial of the study, oldest first."""
    ran: int
    """Trials this call ran (the rest were finished before)."""
    calibration: Calibration | None
    """Fitted on every measured plan; None when none was measured."""
    before: Validation | None
    after: Validation | None
    """Leave-one-out; None with fewer than MIN_PLANS_FOR_HELD_OUT measured plans."""
    calibration_path: Path | None = None
    """The profile file the calibration was stored in; None when it was not stored."""

    @property
    def validations(self) -> tuple[Validation, ...]:
        """The figures before and after calibration, those there are."""
        return tuple(v for v in (self.before, self.after) if v is not None)

    @property
    def measured(self) -> tuple[TrialRecord, ...]:
        """The trials that measured their plan."""
        return tuple(r for r in self.records if r.report is not None)

    @property
    def best(self) -> TrialRecord | None:
        """The fastest measured plan."""
        return min(self.measured, key=lambda r: r.report.measured_step_time_s if r.report else 0.0, default=None)


def calibration_target(cluster: str, *, calibrate: bool, save_to: Path | None) -> Path | None:
    """The profile file a tune stores its calibration in: ``save_to``, else the ``cluster`` file;
    None without ``calibrate``.

    Raises:
        SchemaError: ``calibrate`` with a preset cluster and no ``save_to`` (a preset is not a file).
    """
    if not calibrate:
        return None
    target = save_to or (Path(cluster) if Path(cluster).is_file() else None)
    if target is None:
        raise SchemaError(
            f"--cluster {cluster} is a preset, which cannot be overwritten; give --save-calibration PATH "
            "(or --no-calibrate; in Python save_calibration=PATH or calibrate=False)"
        )
    return target


def run_trials(
    plans: Sequence[Plan],
    settings: TuneSettings,
    study_name: str,
    *,
    run_trial: RunTrial = run_trial_job,
    progress: Progress | None = None,
) -> tuple[list[TrialRecord], int]:
    """Run each of ``plans`` not yet finished in the study, one after the other.

    Args:
        plans: the plans to run, in order.
        settings: steps, study storage, launcher, time limit, working directory.
        study_name: the Optuna study the trials belong to (created on first use).
        run_trial: how a plan runs (tests replace the job with a function).
        progress: called as progress(done, total) over the plans.

    Returns:
        Every finished trial of the study (oldest first), and how many this call ran.
    """
    study = open_study(settings.storage, study_name)
    done = finished_keys(study)
    settings.workdir.mkdir(parents=True, exist_ok=True)
    ran = 0
    for i, plan in enumerate(plans):
        if progress is not None:
            progress(i, len(plans))
        key = plan_key(plan)
        if key in done:
            continue
        files = TrialFiles.in_dir(settings.workdir, key)
        save_plan(plan, files.plan)
        trial = start_trial(study, plan)
        outcome = run_trial(plan, files, settings)
        finish_trial(study, trial, outcome.report, outcome.failure)
        ran += 1
    if progress is not None:
        progress(len(plans), len(plans))
    return records(study), ran


def measured_observations(records: Sequence[TrialRecord]) -> list[Observation]:
    """The measured trials as observations, labelled '#number layout'."""
    return [
        Observation.from_report(f"#{r.number} {r.plan.layout.describe()}", r.plan, r.report)
        for r in records
        if r.report is not None
    ]


def summarize(
    *, study_name: str, records: list[TrialRecord], cluster: ClusterProfile, source: str, ran: int = 0
) -> TuneResult:
    """Calibration and validation of a study's trials (``planner validate`` shows a stored study)."""
    observations = measured_observations(records)
    before = before_calibration(observations, cluster) if observations else None
    after, weight = (
        after_calibration(observations, cluster)
        if len(observations) >= MIN_PLANS_FOR_HELD_OUT
        else (None, DEFAULT_PRIOR_WEIGHT)
    )
    # Time and memory factors are each kept only when they predict held-out plans better than
    # the model alone: on a noisy machine a model already within its noise gains nothing from
    # factors fitted to that noise (measured: 9.3% uncalibrated, 13.5% calibrated held out).
    fit_time = after is None or before is None or improves_time(before, after)
    fit_memory = after is None or before is None or improves_memory(before, after)
    if after is not None and before is not None:
        after = after if fit_time else with_time_of(after, before)
        after = after if fit_memory else with_memory_of(after, before)
    calibration = (
        fit_calibration(
            observations, cluster, source=source, prior_weight=weight, fit_time=fit_time, fit_memory=fit_memory
        )
        if observations
        else None
    )
    return TuneResult(
        study_name=study_name,
        records=tuple(records),
        ran=ran,
        calibration=calibration,
        before=before,
        after=after,
    )
