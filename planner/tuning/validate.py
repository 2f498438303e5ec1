"""How right the model was: predicted beside measured for every measured plan.

Figures (errors are (predicted - measured) / measured; "median" and "worst" are of their size):
- Spearman rank correlation of predicted and measured step times (1: the model orders the plans
  as the runs did);
- top-1 regret: measured time of the plan the model ranks first / the best measured time
  (1.0: the model's pick was the fastest);
- median and worst step-time error over plans, and per-rank memory error over every rank
  measured with a comparable method.

After calibration the figures are leave-one-out: each plan is predicted by factors fitted on
the other plans only, so no plan is judged by factors it helped fit.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy.stats import spearmanr

from cost_models.memory import workspace_bytes
from planner.schemas import ClusterProfile, Estimate
from planner.tuning.calibrate import PRIOR_WEIGHTS, Observation, fit_calibration, uncalibrated


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """One plan: its step time and per-rank memory, predicted beside measured."""

    label: str
    predicted_step_time_s: float
    measured_step_time_s: float
    memory: tuple[tuple[float, float], ...]
    """(predicted, measured) bytes of each comparably measured rank."""

    @property
    def time_error(self) -> float:
        """(predicted - measured) / measured step time."""
        return (self.predicted_step_time_s - self.measured_step_time_s) / self.measured_step_time_s


MIN_PLANS_FOR_RANKS = 5
"""Plans below which the rank figures mean nothing: with 4 plans or fewer no Spearman correlation
is significant at the 5% level (one-sided; 5 plans need rho = 0.9), and a top-1 pick among so few
says little."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """The figures of one set of predictions (module docstring)."""

    title: str
    plans: tuple[PlanResult, ...]
    spearman: float
    top1_regret: float
    median_time_error: float
    worst_time_error: float
    median_memory_error: float | None
    worst_memory_error: float | None
    """None when no rank was measured with a comparable method."""

    @property
    def ranks_meaningful(self) -> bool:
        """Whether there are enough plans for the rank figures to mean something (``MIN_PLANS_FOR_RANKS``)."""
        return len(self.plans) >= MIN_PLANS_FOR_RANKS


def plan_result(obs: Observation, est: Estimate, workspace: float) -> PlanResult:
    """``obs`` beside the estimate ``est`` of its plan; memory as the tensors the measured peaks
    count: the estimate less the uncalibrated ``workspace`` bytes (a calibrated offset stays in)."""
    return PlanResult(
        label=obs.label,
        predicted_step_time_s=est.step_time_s,
        measured_step_time_s=obs.measured_step_time_s,
        memory=tuple((est.stages[s.stage].memory.total_bytes - workspace, s.measured_bytes) for s in obs.memory),
    )


def validate(title: str, plans: Sequence[PlanResult]) -> Validation:
    """The figures of ``plans``; the rank correlation needs two plans (NaN with fewer, or constant)."""
    predicted = [p.predicted_step_time_s for p in plans]
    measured = [p.measured_step_time_s for p in plans]
    rho = float(spearmanr(predicted, measured).statistic) if len(plans) >= 2 else float("nan")
    pick = min(plans, key=lambda p: p.predicted_step_time_s)
    time_errors = [abs(p.time_error) for p in plans]
    memory_errors = [abs(pred - meas) / meas for p in plans for pred, meas in p.memory]
    return Validation(
        title=title,
        plans=tuple(plans),
        spearman=rho,
        top1_regret=pick.measured_step_time_s / min(measured),
        median_time_error=statistics.median(time_errors),
        worst_time_error=max(time_errors),
        median_memory_error=statistics.median(memory_errors) if memory_errors else None,
        worst_memory_error=max(memory_errors) if memory_errors else None,
    )


def before_calibration(observations: Sequence[Observation], cluster: ClusterProfile) -> Validation:
    """The uncalibrated model against every measured plan."""
    base = uncalibrated(cluster)
    workspace = workspace_bytes(cluster)
    return validate("uncalibrated model", [plan_result(obs, obs.predict(base), workspace) for obs in observations])


PULL_TOLERANCE = 0.01
"""Held-out median step-time error within which a stronger pull is preferred."""


def after_calibration(observations: Sequence[Observation], cluster: ClusterProfile) -> tuple[Validation, float]:
    """Each plan predicted with factors fitted on the others (leave-one-out; needs 2 plans), at
    the strongest prior weight (calibrate.PRIOR_WEIGHTS) whose median step-time error is within
    PULL_TOLERANCE of the least; that weight.

    The weight is the one figure chosen with every plan in view (one of four), so the figures
    are a shade optimistic; the factors themselves never see the plan they predict."""
    tried = []
    workspace = workspace_bytes(cluster)
    for weight in PRIOR_WEIGHTS:
        results = []
        for i, obs in enumerate(observations):
            others = [o for j, o in enumerate(observations) if j != i]
            calibration = fit_calibration(others, cluster, prior_weight=weight)
            calibrated = cluster.model_copy(update={"calibration": calibration})
            results.append(plan_result(obs, obs.predict(calibrated), workspace))
        tried.append((validate("calibrated, leave-one-out", results), weight))
    # The strongest pull whose error is within a point of the least: among fits the held-out
    # plans cannot tell apart, the one closest to the physical model (no scale near 0).
    least = min(v.median_time_error for v, _ in tried)
    return max((vw for vw in tried if vw[0].median_time_error <= least + PULL_TOLERANCE), key=lambda vw: vw[1])


def improves_time(before: Validation, after: Validation) -> bool:
    """Whether the calibrated step times predict the held-out plans better (median error) by more
    than PULL_TOLERANCE: step times are noisy, and within a point the held-out plans cannot tell a
    fit from the model alone (8 plans with +-8% noise: 8.1% alone, 7.9% fitted to the noise)."""
    return after.median_time_error < before.median_time_error - PULL_TOLERANCE


def with_time_of(after: Validation, before: Validation) -> Validation:
    """``after`` with the step-time predictions of ``before`` (time left uncalibrated)."""
    step = {p.label: p.predicted_step_time_s for p in before.plans}
    return validate(after.title, [replace(p, predicted_step_time_s=step[p.label]) for p in after.plans])


def improves_memory(before: Validation, after: Validation) -> bool:
    """Whether the calibrated memory predicts the held-out ranks better (median error)."""
    if before.median_memory_error is None or after.median_memory_error is None:
        return False
    return after.median_memory_error < before.median_memory_error


def with_memory_of(after: Validation, before: Validation) -> Validation:
    """``after`` with the memory predictions of ``before`` (memory left uncalibrated)."""
    memory = {p.label: p.memory for p in before.plans}
    return validate(after.title, [replace(p, memory=memory[p.label]) for p in after.plans])
