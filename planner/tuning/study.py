"""Tuning trials in an Optuna study: one trial per plan run, resumable across interruptions.

A trial holds its plan (JSON) and plan key in its user attributes. A run that measured the plan
is COMPLETE, its value the measured step time and its RunReport stored beside it. A run that
failed is FAIL with its reason. A trial left RUNNING by a tuner that was stopped is marked FAIL
("interrupted") when the tuner comes back, and its plan runs again; a plan with a COMPLETE trial,
or a FAIL trial for any other reason, never runs twice.
"""

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from planner.schemas import ClusterProfile, Plan, RunReport, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.search_engine.optuna_import import optuna_module

if TYPE_CHECKING:  # optuna is imported where a study is opened (``optuna_import``)
    import optuna

INTERRUPTED = "interrupted: the tuner stopped during this trial"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One finished trial: its plan and the run's report, or the reason it failed."""

    number: int
    plan: Plan
    report: RunReport | None
    failure: str | None

    @property
    def key(self) -> str:
        """The plan's key (see ``plan_key``)."""
        return plan_key(self.plan)


def plan_key(plan: Plan) -> str:
    """What makes two plans the same trial of a study: model, training and layout (a study is of
    one measured cluster, whatever its calibration; see ``study_name``)."""
    text = "|".join((plan.model.model_dump_json(), plan.training.model_dump_json(), repr(plan.layout)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def study_name(model: str, training: TrainingSpec, cluster: ClusterProfile) -> str:
    """A study per model, training and measured cluster (calibration left out: it changes with tuning)."""
    measured = cluster.model_copy(update={"calibration": None}).model_dump_json()
    digest = hashlib.sha256(f"{model}|{training.model_dump_json()}|{measured}".encode()).hexdigest()[:10]
    return f"tune-{model}-{digest}"


def open_study(storage: str, name: str) -> "optuna.Study":
    """The study, created on first use; trials of a stopped tuner are marked interrupted."""
    lib = optuna_module()
    states = lib.trial.TrialState
    study: optuna.Study = lib.create_study(storage=storage, study_name=name, direction="minimize", load_if_exists=True)
    for trial in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
        lib.trial.Trial(study, trial._trial_id).set_user_attr("failure", INTERRUPTED)
        study.tell(trial.number, state=states.FAIL)
    return study


def finished_keys(study: "optuna.Study") -> set[str]:
    """Keys of the plans that ran to a verdict (measured, or failed for a reason of their own)."""
    return {record.key for record in records(study)}


def records(study: "optuna.Study") -> list[TrialRecord]:
    """The study's finished trials, oldest first, interrupted ones left out."""
    out = []
    states = optuna_module().trial.TrialState
    for trial in study.get_trials(deepcopy=False, states=(states.COMPLETE, states.FAIL)):
        attrs = trial.user_attrs
        if "plan" not in attrs or attrs.get("failure") == INTERRUPTED:
            continue
        report = RunReport.model_validate_json(attrs["report"]) if "report" in attrs else None
        out.append(
            TrialRecord(
                number=trial.number,
                plan=Plan.model_validate_json(attrs["plan"]),
                report=report,
                failure=attrs.get("failure"),
            )
        )
    return out


def stored_records(storage: str, study: str | None = None) -> tuple[str, list[TrialRecord]]:
    """The finished trials of a stored study, without creating anything.

    Args:
        storage: the Optuna storage URL a tune wrote to (e.g. ``sqlite:///tune.db``).
        study: the study's name; None: the storage's only or newest study.

    Returns:
        The study's name and its finished trials, oldest first.

    Raises:
        SchemaError: no such storage file, no study in it, no study of that name, or no finished trial.
    """
    sqlite_path = storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else None
    if sqlite_path is not None and not Path(sqlite_path).is_file():
        raise SchemaError(f"--storage {storage}: no such file; give the storage planner tune wrote to")
    lib = optuna_module()
    summaries = lib.get_all_study_summaries(storage)
    if not summaries:
        raise SchemaError(f"--storage {storage} holds no study; run planner tune first")
    names = [s.study_name for s in summaries]
    if study is not None and study not in names:
        raise SchemaError(f"--study {study!r} is not in {storage}; it holds {', '.join(names)}")
    name = study or max(summaries, key=lambda s: s.datetime_start or datetime.min).study_name
    finished = records(lib.load_study(study_name=name, storage=storage))
    if not finished:
        raise SchemaError(f"study {name} has no finished trial yet")
    return name, finished


def start_trial(study: "optuna.Study", plan: Plan) -> "optuna.trial.Trial":
    """A RUNNING trial for ``plan``, its plan and prediction recorded."""
    trial = study.ask()
    trial.set_user_attr("plan", plan.model_dump_json())
    trial.set_user_attr("plan_key", plan_key(plan))
    trial.set_user_attr("layout", plan.layout.describe())
    trial.set_user_attr("predicted_step_time_s", plan.estimate.step_time_s)
    trial.set_user_attr("predicted_peak_memory_bytes", plan.estimate.peak_memory_bytes)
    return trial


def finish_trial(
    study: "optuna.Study", trial: "optuna.trial.Trial", report: RunReport | None, failure: str | None
) -> None:
    """Record the run: COMPLETE with the measured step time, or FAIL with its reason."""
    if report is None:
        trial.set_user_attr("failure", failure or "no report")
        study.tell(trial, state=optuna_module().trial.TrialState.FAIL)
        return
    trial.set_user_attr("report", report.model_dump_json())
    trial.set_user_attr("measured_step_time_s", report.measured_step_time_s)
    trial.set_user_attr("measured_peak_memory_bytes", max(m.peak_bytes for m in report.memory))
    study.tell(trial, report.measured_step_time_s)
