"""The tuner's bookkeeping with fake runs, through the API (``planner.tune``): failed trials are
kept with their reason and skipped, an interrupted tune resumes without running a finished plan
twice, and the calibration it fits moves estimates the way the measurements did. The profile is
left as it is (calibrate=False), so that every tune ranks the plans alike."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import make_cluster
from fakes import TRUE, FakeRunner, true_machine

import planner
from planner.files.clusters import save_cluster
from planner.schemas import TrainingSpec, VocabularyLayout
from planner.schemas.settings import Selection, TuneSettings
from planner.tuning.calibrate import MEMORY_SCALES, Observation, fit_calibration
from planner.tuning.study import INTERRUPTED
from planner.tuning.tuner import TuneResult

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)


# Slow links, so that communication is a visible share of the step.
CLUSTER = make_cluster(per_node=4, memory_bytes=2 * 2**30, intra_bw=2e8)
MACHINE = true_machine(CLUSTER)


@pytest.fixture
def cluster_path(tmp_path: Path) -> str:
    path = tmp_path / "cluster.json"
    save_cluster(CLUSTER, path)
    return str(path)


def tune(model: str, cluster: str, training: TrainingSpec, settings: TuneSettings, **options: Any) -> TuneResult:
    return planner.tune(model, cluster, training, replace(settings, calibrate=False), **options)


def settings(tmp_path: Path, top_k: int = 5, select: Selection = Selection.TOP) -> TuneSettings:
    # Vocabulary pinned: the spread of plans then keeps tp and pp above 1 among few plans.
    return TuneSettings(
        top_k=top_k,
        select=select,
        storage=f"sqlite:///{tmp_path / 'tune.db'}",
        workdir=tmp_path / "trials",
        vocabulary_layouts=(VocabularyLayout.PINNED,),
    )


def test_a_failed_trial_is_recorded_with_its_reason_and_the_tuner_goes_on(tmp_path: Path, cluster_path: str) -> None:
    runner = FakeRunner(MACHINE, fail={1: "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"})
    result = tune("tiny-gpt", cluster_path, TRAINING, settings(tmp_path), run_trial=runner)

    assert len(runner.ran) == 5 and result.ran == 5
    failed = [r for r in result.records if r.report is None]
    assert [r.failure for r in failed] == ["out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert len(result.measured) == 4
    assert result.best is not None and result.best.report is not None
    # The failed plan is never the answer, and the study says FAIL with the reason.
    assert result.best.key != failed[0].key
    study = optuna.load_study(study_name=result.study_name, storage=settings(tmp_path).storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4

    # A second tune runs nothing: the failure is a verdict too.
    again = FakeRunner(MACHINE)
    assert tune("tiny-gpt", cluster_path, TRAINING, settings(tmp_path), run_trial=again).ran == 0
    assert again.ran == []


def test_an_interrupted_tune_resumes_without_running_a_finished_plan_twice(tmp_path: Path, cluster_path: str) -> None:
    first = FakeRunner(MACHINE, interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        tune("tiny-gpt", cluster_path, TRAINING, settings(tmp_path), run_trial=first)
    assert len(first.ran) == 2

    second = FakeRunner(MACHINE)
    result = tune("tiny-gpt", cluster_path, TRAINING, settings(tmp_path), run_trial=second)

    assert len(second.ran) == 3  # the interrupted plan and the two never started
    assert not set(first.ran) & set(second.ran)
    assert sorted(first.ran + second.ran) == sorted(r.plan.layout.describe() for r in result.records)
    study = optuna.load_study(study_name=result.study_name, storage=settings(tmp_path).storage)
    interrupted = [t for t in study.trials if t.user_attrs.get("failure") == INTERRUPTED]
    assert len(interrupted) == 1 and interrupted[0].state is optuna.trial.TrialState.FAIL
    assert len(result.records) == 5 and all(r.report is not None for r in result.records)


def test_calibration_recovers_the_machine_and_moves_estimates_its_way(tmp_path: Path, cluster_path: str) -> None:
    # Plans spread over the ranking, so that every factor has plans it shows in (tp > 1, p > 1, ...).
    spread = settings(tmp_path, top_k=12, select=Selection.SPREAD)
    result = tune("tiny-gpt", cluster_path, TRAINING, spread, run_trial=FakeRunner(MACHINE))
    cal = result.calibration
    assert cal is not None and cal.trials == 12
    assert {r.plan.layout.tensor_parallel_degree for r in result.records} > {1}

    # The fake runs are the model under known factors. Without a pull toward the uncalibrated
    # model the fit finds them all; the tuner's pull (chosen on held-out error) may trade compute
    # for overheads where the plans cannot tell them apart, but not its predictions.
    observations = [Observation.from_report(str(r.number), r.plan, r.report) for r in result.measured if r.report]
    exact = fit_calibration(observations, CLUSTER, prior_weight=0.0)
    for name, value in TRUE.items():
        assert exact.factors[name] == pytest.approx(value, rel=1e-3), name
        if name in (*MEMORY_SCALES, "memory_overhead_bytes"):
            assert cal.factors[name] == pytest.approx(value, rel=1e-3), name  # memory: no pull, exact
    calibrated = CLUSTER.model_copy(update={"calibration": cal})
    for obs in observations:
        assert obs.predict(calibrated).step_time_s == pytest.approx(obs.measured_step_time_s, rel=0.02)

    # Before: the model is off; after (each plan left out of its own fit): within a percent.
    assert result.before is not None and result.after is not None
    assert result.before.median_time_error > 0.1
    assert result.after.median_time_error < 0.01
    assert result.before.median_memory_error is not None and result.before.median_memory_error > 1e-3
    assert result.after.median_memory_error is not None and result.after.median_memory_error < 1e-6
    before = {p.label: p for p in result.before.plans}
    for plan in result.after.plans:  # every estimate moves toward what its plan measured
        was = before[plan.label]
        assert (plan.predicted_step_time_s - was.predicted_step_time_s) * (
            plan.measured_step_time_s - was.predicted_step_time_s
        ) > 0
        for (after, measured), (b, _) in zip(plan.memory, was.memory, strict=True):
            assert (after - b) * (measured - b) > 0


def test_factors_that_do_not_help_held_out_plans_are_left_at_identity(tmp_path: Path, cluster_path: str) -> None:
    # The runs are the uncalibrated model itself, each step time off by a fixed +-8%: no factor
    # predicts a held-out plan better than the model alone, so the tuner keeps none for time.
    # Memory is exact on the true machine's factors, so memory factors are kept.
    class Noisy(FakeRunner):
        def __call__(self, plan, files, settings):  # type: ignore[no-untyped-def]
            run = super().__call__(plan, files, settings)
            assert run.report is not None
            sign = 1 if len(self.ran) % 2 else -1
            step = run.report.measured_step_time_s * (1 + 0.08 * sign)
            noisy = run.report.model_copy(update={"measured_step_time_s": step})
            return type(run)(report=noisy, failure=None, seconds=run.seconds, log_path=run.log_path)

    memory_only = CLUSTER.model_copy(
        update={"calibration": true_machine(CLUSTER).calibration.model_copy(  # type: ignore[union-attr]
            update={name: 1.0 for name in ("compute_scale", "tensor_parallel_scale", "communication_scale")}
            | {"step_overhead_s": 0.0, "micro_batch_overhead_s": 0.0}
        )}
    )  # fmt: skip
    # 8 plans spread over the ranking (tp and pp 1 and 2 among them): the leave-one-out fits cost
    # plans squared, and 8 make the case as 12 do.
    spread = settings(tmp_path, top_k=8, select=Selection.SPREAD)
    result = tune("tiny-gpt", cluster_path, TRAINING, spread, run_trial=Noisy(memory_only))
    assert result.before is not None and result.after is not None and result.calibration is not None
    layouts = [r.plan.layout for r in result.records]
    assert {lay.tensor_parallel_degree for lay in layouts} > {1}
    assert {lay.pipeline_parallel_degree for lay in layouts} > {1}
    # Fitted on every plan, the time factors do chase the noise: leaving them out is a verdict.
    observations = [Observation.from_report(str(r.number), r.plan, r.report) for r in result.measured if r.report]
    assert abs(fit_calibration(observations, CLUSTER).factors["compute_scale"] - 1.0) > 0.05
    assert result.calibration.trials == 0
    for name in ("compute_scale", "tensor_parallel_scale", "communication_scale"):
        assert result.calibration.factors[name] == 1.0
    assert result.calibration.step_overhead_s == 0.0 and result.calibration.micro_batch_overhead_s == 0.0
    assert result.after.median_time_error == result.before.median_time_error  # the model's own
    assert result.calibration.memory_samples > 0 and result.calibration.logits_memory_scale == pytest.approx(2.0)
