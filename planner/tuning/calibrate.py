"""Fit a cluster's Calibration from measured runs (the formula is in planner.schemas.calibration).

Time: measured step time = a x compute terms + b x tensor-parallel terms + c x other
communication + d + e x micro-batch slots, in relative error
(every plan counts alike), factors >= 0: non-negative least squares on the uncalibrated terms
(scipy.optimize.nnls) for a start, then the calibrated model itself by least squares
(scipy.optimize.least_squares), which also settles how much data-parallel communication the
scaled backward hides. A term no plan exercises (a column of zeros) keeps its identity value;
with fewer plans than factors only one scale is fitted, on the whole step.

Memory: over every measured rank whose method counts tensors (MemTracker, CUDA allocator; not RSS
growth), measured - model states = a x activations + l x logits + b x buffers + o: the
estimate's workspace is left out, as no tensor holds it (on CUDA the run report measures it
apart: ``RankMemory``'s reserved and driver-used figures), so o is the tensors' own offset,
not the assumed workspace fitted away;
by least squares in relative error with a, l, b >= 0 (bounded linear least squares,
scipy.optimize.lsq_linear); o may be negative. A term no measured rank has keeps its identity.
The tuner keeps them only when they predict held-out ranks better than the model alone
(planner.tuning.tuner.summarize).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from scipy.optimize import least_squares, lsq_linear, nnls

from cost_models.calibration import COMMUNICATION_TERMS, COMPUTE_TERMS, TENSOR_PARALLEL_TERMS
from cost_models.estimate import estimate
from cost_models.pipeline import micro_batch_slots
from planner.schemas import Calibration, ClusterProfile, Estimate, MemoryBreakdown, Plan, RunReport
from planner.schemas.errors import PlannerError
from planner.schemas.geometry import num_micro_batches, pipeline_schedules

PRIOR_WEIGHTS = (0.0, 0.03, 0.1, 0.3)
"""Candidate pulls of the time factors toward the uncalibrated model (scales 1, overhead 0), as
a relative error: at 0.1 a factor of 2 costs as much as a 7% error on one plan. Compute and a
per-step overhead are nearly interchangeable when the measured plans do similar work; without a
pull a dozen noisy plans can trade one for the other (measured: compute 0.0, overhead 0.23 s).
planner.tuning.validate picks the pull whose leave-one-out error is least."""
DEFAULT_PRIOR_WEIGHT = 0.1
"""The pull with too few plans to pick one."""

COMPARABLE_MEMORY_METHODS = ("MemTracker", "cuda max_memory_allocated")
"""Peak-memory methods that count the tensors the cost model counts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSample:
    """One rank's measured peak beside the model's figures for its stage."""

    rank: int
    stage: int
    measured_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """A measured plan: what to re-estimate, and what its run measured."""

    label: str
    plan: Plan
    measured_step_time_s: float
    memory: tuple[RankSample, ...]
    """Ranks measured with a comparable method (empty when none was)."""

    @classmethod
    def from_report(cls, label: str, plan: Plan, report: RunReport) -> "Observation":
        """The observation of ``plan``'s run."""
        samples = tuple(
            RankSample(rank=m.rank, stage=m.stage, measured_bytes=float(m.peak_bytes))
            for m in report.memory
            if m.method in COMPARABLE_MEMORY_METHODS
        )
        return cls(label=label, plan=plan, measured_step_time_s=report.measured_step_time_s, memory=samples)

    def predict(self, cluster: ClusterProfile) -> Estimate:
        """The plan's estimate on ``cluster`` (calibrated or not, as the profile is)."""
        p = self.plan
        return estimate(p.model, p.training, cluster, p.layout)


def uncalibrated(cluster: ClusterProfile) -> ClusterProfile:
    """The profile with its calibration removed."""
    return cluster.model_copy(update={"calibration": None})


def fit_calibration(
    observations: Sequence[Observation],
    cluster: ClusterProfile,
    *,
    source: str = "",
    prior_weight: float = DEFAULT_PRIOR_WEIGHT,
    fit_time: bool = True,
    fit_memory: bool = True,
) -> Calibration:
    """Factors that bring the uncalibrated model closest to ``observations`` (the time factors
    left at identity without ``fit_time``, the memory factors without ``fit_memory``).

    Raises:
        PlannerError: no observation to fit.
    """
    if not observations:
        raise PlannerError("no measured plan to calibrate on: every trial failed (see the trial table)")
    base = uncalibrated(cluster)
    estimates = [obs.predict(base) for obs in observations]
    time_factors = _fit_time(observations, estimates, base, prior_weight) if fit_time else {}
    rows = [
        (est.stages[s.stage].memory, s.measured_bytes)
        for obs, est in zip(observations, estimates, strict=True)
        for s in obs.memory
        if fit_memory
    ]
    return Calibration(
        **time_factors,
        **_fit_memory(rows),
        created=datetime.now(UTC),
        trials=len(observations) if fit_time else 0,
        memory_samples=len(rows),
        source=source,
    )


TIME_FACTORS = (
    "compute_scale",
    "tensor_parallel_scale",
    "communication_scale",
    "step_overhead_s",
    "micro_batch_overhead_s",
)
SCALES = 3
"""The first SCALES time factors multiply terms of the estimate; the rest are overheads."""


def _fit_time(
    observations: Sequence[Observation], estimates: Sequence[Estimate], base: ClusterProfile, prior_weight: float
) -> dict[str, float]:
    """The time factors: a linear start, then the model itself fitted."""
    slots = [
        micro_batch_slots(
            obs.plan.layout,
            num_micro_batches(obs.plan.training.global_batch_size, obs.plan.layout),
            pipeline_schedules(obs.plan.layout, obs.plan.training.pipeline_flushes),
        )
        for obs in observations
    ]
    x = np.array(
        [
            [
                sum(getattr(e.time, t) for t in COMPUTE_TERMS),
                sum(getattr(e.time, t) for t in TENSOR_PARALLEL_TERMS),
                sum(getattr(e.time, t) for t in COMMUNICATION_TERMS),
                1.0,
                float(n),
            ]
            for e, n in zip(estimates, slots, strict=True)
        ]
    )
    y = np.array([obs.measured_step_time_s for obs in observations])
    identity = np.array([1.0] * SCALES + [0.0] * (len(TIME_FACTORS) - SCALES))
    if len(y) < len(TIME_FACTORS):
        ratio = float(y.sum() / x[:, :SCALES].sum())
        return dict(zip(TIME_FACTORS, [ratio] * SCALES + [0.0] * (len(TIME_FACTORS) - SCALES), strict=True))
    used = [j for j in range(x.shape[1]) if np.any(x[:, j] > 0)]
    start, _ = nnls(x[:, used] / y[:, None], np.ones_like(y))  # relative residuals: every plan counts alike
    factors = identity.copy()
    # What the pull toward the uncalibrated model measures: log of each scale, each overhead as a
    # share of a typical step.
    typical_s, typical_slots = float(np.median(y)), float(np.median(slots))
    overhead_unit = {SCALES: typical_s, SCALES + 1: typical_s / typical_slots}

    def residuals(free: np.ndarray) -> np.ndarray:
        factors[used] = free
        cal = Calibration(
            **dict(zip(TIME_FACTORS, factors.tolist(), strict=True)),
            created=datetime(2000, 1, 1, tzinfo=UTC),
            trials=0,
            memory_samples=0,
        )
        calibrated = base.model_copy(update={"calibration": cal})
        errors = [obs.predict(calibrated).step_time_s / obs.measured_step_time_s - 1 for obs in observations]
        prior = [np.log(factors[j]) if j < SCALES else factors[j] / overhead_unit[j] for j in used]
        return np.array(errors + [prior_weight * p for p in prior])

    # The linear start misses one thing: how much data-parallel communication the scaled
    # backward hides. Fitting the model itself settles it.
    lower = [1e-6 if j < SCALES else 0.0 for j in used]
    fitted = least_squares(
        residuals, np.maximum(start, [1e-3 if j < SCALES else 0.0 for j in used]), bounds=(lower, np.inf), x_scale="jac"
    )
    factors[used] = fitted.x
    return dict(zip(TIME_FACTORS, factors.tolist(), strict=True))


MEMORY_SCALES = ("activation_memory_scale", "logits_memory_scale", "buffer_memory_scale")
"""Memory factors that scale a term of the estimate, in _memory_terms' order."""


def _memory_terms(memory: MemoryBreakdown) -> tuple[float, float, float]:
    return memory.activations_bytes, memory.logits_bytes, memory.communication_buffers_bytes


def _fit_memory(rows: Sequence[tuple[MemoryBreakdown, float]]) -> dict[str, float]:
    """The memory factors by least squares in relative error, as reported (module docstring)."""
    identity = dict.fromkeys(MEMORY_SCALES, 1.0) | {"memory_overhead_bytes": 0.0}
    if not rows:
        return identity
    measured = np.array([m for _, m in rows])
    terms = np.array([_memory_terms(mem) for mem, _ in rows])
    # tensors only: measured peaks count no workspace (module docstring)
    fixed = np.array([mem.tensors_bytes for mem, _ in rows]) - terms.sum(axis=1)
    used = [j for j in range(terms.shape[1]) if np.any(terms[:, j] > 0)]
    x = np.column_stack([terms[:, used] / measured[:, None], 1.0 / measured])
    y = (measured - fixed) / measured
    if len(rows) <= len(used):  # too few ranks for every term: the offset alone
        offset = float(np.sum((measured - fixed - terms.sum(axis=1)) / measured) / np.sum(1.0 / measured))
        return identity | {"memory_overhead_bytes": offset}
    lower = [0.0] * len(used) + [-np.inf]
    solution = lsq_linear(x, y, bounds=(lower, [np.inf] * (len(used) + 1))).x
    fitted = identity | {MEMORY_SCALES[j]: float(v) for j, v in zip(used, solution[:-1], strict=True)}
    return fitted | {"memory_overhead_bytes": float(solution[-1])}
