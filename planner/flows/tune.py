"""`planner tune` and `planner validate`: run the search's best plans for real, fit the cluster's
calibration from what they measured, and say how right the model was before and after."""

from dataclasses import replace
from typing import TYPE_CHECKING

from planner.files.clusters import load_cluster, save_cluster
from planner.files.models import load_model
from planner.flows.extras import require_torch
from planner.flows.search import search
from planner.schemas import ModelSpec, TrainingSpec
from planner.schemas.runtime_support import check_buildable
from planner.schemas.settings import SearchSettings, TuneSettings
from planner.search_engine.strategy import Progress

if TYPE_CHECKING:  # the modules behind these import scipy: loaded on use
    from planner.tuning.tuner import RunTrial, TuneResult


def tune(
    model: ModelSpec | str,
    cluster: str,
    training: TrainingSpec,
    settings: TuneSettings = TuneSettings(),
    *,
    run_trial: "RunTrial | None" = None,
    progress: Progress | None = None,
) -> "TuneResult":
    """Run the search's best plans for a few steps each as trials of an Optuna study, fit the
    cluster's calibration from the measured ones and store it in the profile.

    A stopped tune resumes: a plan the study finished (measured or failed) never runs again.

    Args:
        model: a ModelSpec, a preset name or a config file.
        cluster: a preset ``NAME:NODES`` or a profile path (recorded in the plans).
        training: global batch (sequences), sequence length (tokens), precision.
        settings: plans to run, steps, study, launcher, where the calibration goes (``TuneSettings``).
        run_trial: how a plan runs (default: its job, locally with torchrun or through the launcher).
        progress: called as progress(done, total) over the plans.

    Returns:
        Every finished trial of the study, the fitted calibration, the figures before and after
        it, and where it was stored.

    Raises:
        SchemaError: an input or the launcher template is invalid; calibrating a preset cluster
            with no ``save_calibration``.
        InfeasibleConfigError: no layout fits, or the runtime does not build the model
            (``schemas.runtime_support.check_buildable``).
        MissingExtraError: the trials run here (no launcher) and torch is not installed.
    """
    if settings.launcher is None and run_trial is None:  # a launcher's jobs find torch on their cluster
        require_torch("planner tune")
    from planner.tuning.launcher import check_template
    from planner.tuning.selection import pool_size, select_plans
    from planner.tuning.study import study_name
    from planner.tuning.tuner import calibration_target, run_trial_job, run_trials, summarize

    model_spec = load_model(model) if isinstance(model, str) else model
    check_buildable(model_spec)  # every trial runs on the planner's runtime
    target = calibration_target(cluster, calibrate=settings.calibrate, save_to=settings.save_calibration)
    if settings.launcher is not None:
        check_template(settings.launcher)
    profile = load_cluster(cluster)
    # The plans run on the planner's runtime, which shards over whole groups only.
    wanted = SearchSettings(
        top_k=pool_size(settings), vocabulary_layouts=settings.vocabulary_layouts, hierarchical_sharding=False
    )
    plans = select_plans(search(model_spec, cluster, training, wanted), settings)
    name = settings.study_name or study_name(model_spec.name, training, profile)
    records, ran = run_trials(plans, settings, name, run_trial=run_trial or run_trial_job, progress=progress)
    result = summarize(study_name=name, records=records, cluster=profile, source=f"{settings.storage} {name}", ran=ran)
    if result.calibration is None or target is None:
        return result
    save_cluster(profile.model_copy(update={"calibration": result.calibration}), target)
    return replace(result, calibration_path=target)


def validate(storage: str = "sqlite:///tune.db", study: str | None = None, cluster: str | None = None) -> "TuneResult":
    """How right the model was on a stored tune's measured plans, before and after calibration.

    Args:
        storage: the Optuna storage a tune wrote to (nothing is created).
        study: the study's name (default: the storage's only or newest study).
        cluster: the profile to predict with (default: the one the plans were made on).

    Returns:
        The study's trials, the calibration fitted on them and the figures before and after it.

    Raises:
        SchemaError: no such storage, study or finished trial; ``cluster`` unreadable.
    """
    from planner.tuning.study import stored_records
    from planner.tuning.tuner import summarize

    name, finished = stored_records(storage, study)
    profile = load_cluster(cluster or finished[0].plan.cluster.spec)
    return summarize(study_name=name, records=finished, cluster=profile, source=f"{storage} {name}")
