"""Optuna TPE over the search space, for spaces too large to enumerate.

Driven through ``study.ask()`` / ``study.tell()`` with a seeded sampler. Each dimension of the
space is one parameter (tp, pp, micro-batch, ZeRO stage, recompute, sequence parallel, virtual
stages); a combination that is not a valid layout, or does not fit, is told as failed. With a
storage URL (SQLite by default from the CLI) the study is resumable: every finished trial is
committed as it ends, and a search started again on the same inputs continues the same study.
"""

import hashlib
import json
import time
from dataclasses import asdict
from typing import ClassVar

import optuna

from planner.schemas import Layout, Recompute, Schedule, ZeroStage
from planner.schemas.errors import DoesNotFitError, InfeasibleConfigError, SchemaError
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import Budget, Candidate, Progress, SearchResult, fastest_first

DEFAULT_TRIALS = 400
"""Trials when the budget sets none."""
DOES_NOT_FIT_PENALTY_S = 1e6
"""Objective of a layout that does not fit, per unit of memory needed over memory usable."""


class OptunaSearch:
    """Tree-structured Parzen estimator over the space's dimensions."""

    name: ClassVar[str] = "optuna"

    def __init__(self, *, storage: str | None = None, study_name: str | None = None) -> None:
        self.storage = storage
        self.study_name = study_name

    def search(
        self, space: SearchSpace, evaluate: Evaluator, budget: Budget, *, seed: int, progress: Progress | None = None
    ) -> SearchResult:
        """Ask, evaluate, tell until the budget is spent; return every feasible layout the study holds."""
        study = optuna.create_study(
            study_name=self.study_name or study_name_for(space, evaluate),
            storage=self.storage,
            sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True),
            direction="minimize",
            load_if_exists=True,
        )
        trials = budget.max_trials if budget.max_trials is not None else DEFAULT_TRIALS
        start, asked = time.perf_counter(), 0
        while asked < trials:
            if budget.max_time_s is not None and time.perf_counter() - start >= budget.max_time_s:
                break
            trial = study.ask()
            asked += 1
            try:
                layout = _suggest(trial, space)
                est = evaluate(layout)
            except DoesNotFitError as e:
                # Worse than any layout that fits, and the more so the further it is from fitting,
                # so the sampler learns where memory runs out.
                trial.set_user_attr("reason", str(e))
                study.tell(trial, DOES_NOT_FIT_PENALTY_S * e.needed_bytes / e.usable_bytes)
            except (InfeasibleConfigError, SchemaError) as e:
                trial.set_user_attr("reason", str(e))
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                trial.set_user_attr("layout", json.dumps(asdict(layout)))
                study.tell(trial, est.step_time_s)
            if progress is not None:
                progress(asked, trials)
        found = {}
        for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if "layout" not in frozen.user_attrs:
                continue  # did not fit
            layout = _layout_from_json(frozen.user_attrs["layout"])
            if layout not in found:
                found[layout] = Candidate(layout, evaluate(layout))
        return SearchResult(
            strategy=self.name, feasible=fastest_first(list(found.values())), evaluated=asked, complete=False
        )


def study_name_for(space: SearchSpace, evaluate: Evaluator) -> str:
    """A name that is the same exactly when the inputs are: resuming continues the right study."""
    key = json.dumps(
        {
            "model": space.model.model_dump(mode="json"),
            "training": space.training.model_dump(mode="json"),
            "cluster": evaluate.cluster.model_dump(mode="json"),
            "margin": evaluate.memory_margin,
        },
        sort_keys=True,
    )
    return f"planner-{space.model.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _suggest(trial: optuna.trial.Trial, space: SearchSpace) -> Layout:
    """Sample a layout, each choice conditional on the ones before it (define-by-run), so that
    nearly every trial is a valid layout: pp among the divisors left by tp, the micro-batch among
    the divisors of dp's per-replica batch that leave at least pp micro-batches, v among the
    chunk counts pp allows."""
    degrees = space.degrees()
    tp = int(trial.suggest_categorical("tp", sorted({t for _, t, _ in degrees})))
    pp = int(trial.suggest_categorical(f"pp|tp={tp}", sorted({p for _, t, p in degrees if t == tp})))
    dp = space.world_size // (tp * pp)
    per_replica = space.training.global_batch_size // dp
    batches = [b for b in space.micro_batch_sizes(dp) if pp == 1 or per_replica // b >= pp]
    if not batches:
        raise InfeasibleConfigError(
            f"dp={dp} leaves no micro-batch size that divides the global batch "
            f"{space.training.global_batch_size} into at least pp={pp} micro-batches"
        )
    b = int(trial.suggest_categorical(f"micro_batch_size|dp={dp},pp={pp}", batches))
    schedules = space.schedules_for(pp, space.training.global_batch_size // (dp * b))
    vs = sorted({v for _, v in schedules})
    v = int(trial.suggest_categorical(f"virtual_stages|pp={pp}", vs)) if len(vs) > 1 else vs[0]
    sp = bool(trial.suggest_categorical("sequence_parallel", list(space.sequence_parallel))) if tp > 1 else False
    zeros = [int(z) for z in space.zero_stages_for(dp, pp)]
    zero = int(trial.suggest_categorical(f"zero_stage|dp={dp},pp={pp}", zeros)) if len(zeros) > 1 else zeros[0]
    return Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        micro_batch_size=b,
        zero_stage=ZeroStage(zero),
        recompute=Recompute(str(trial.suggest_categorical("recompute", [str(r) for r in space.recompute]))),
        sequence_parallel=sp,
        schedule=Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B,
        virtual_stages=v,
    )


def _layout_from_json(text: str) -> Layout:
    raw = json.loads(text)
    raw["layer_split"] = tuple(raw["layer_split"]) if raw["layer_split"] is not None else None
    return Layout(**raw)
