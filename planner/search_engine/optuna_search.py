"""Optuna TPE over the search space, for spaces too large to enumerate.

Driven through ``study.ask()`` / ``study.tell()`` with a seeded sampler. Each axis of the space
(``axes.AXES``, the same declaration the exhaustive strategy iterates) is one parameter, but
an axis ``tried_in_full``, whose every value a trial evaluates, keeping the fastest, and the last
axis, recompute, whose values a trial tries in order (increasing time, decreasing memory) up to
the first that fits, the fastest that does, as the exhaustive strategy prunes
(``SearchSpace.groups``). Sampled, recompute split each good layout into twins that differ by
little time and much memory, and the sampler settled on a twin or a neighbouring basin: on
llama3-70b over 64 A100s (400 trials, seeds 0-9), 1.0295 of the exhaustive optimum at the median
seed sampled, 1.0 tried in order. A combination that is not a valid layout is told as failed,
one that does not fit as penalized.

The last quarter of the trials (``LOCAL_SHARE``) goes to a local search: each asks for an untried
neighbour of the fastest trial so far (one sampled axis moved, ``_neighbours``), enqueued as its
parameters, so it is a trial like the others, stored and learned from; when the fastest has none
left, the sampler picks. TPE finds the right basin but often stops one move short of its floor
(1F1B where interleaving pays, ZeRO-2 where ZeRO-1 fits): on mixtral-8x7b over 64 H100s
(gradients summed in bf16, seeds 0-9) the worst seed went from 1.0862 to 1.0188 of the optimum.

With a storage URL (SQLite by default from the CLI) the study is resumable: every finished trial is
committed as it ends, and a search started again on the same inputs continues the same study.
"""

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

from planner.schemas import Estimate, Layout
from planner.schemas.choices import Choice
from planner.schemas.errors import DoesNotFitError, InfeasibleConfigError, SchemaError
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.optuna_import import optuna_module
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import Candidate, Progress, SearchResult, fastest_first

if TYPE_CHECKING:  # optuna is imported where a study is made (``optuna_import``)
    import optuna

DEFAULT_TRIALS = 400
"""Trials when the budget sets none."""
LOCAL_SHARE = 0.25
"""Share of the trials spent last on the untried neighbours of the fastest trial so far
(``_neighbours``) while it has any, instead of on the sampler's picks."""
DOES_NOT_FIT_PENALTY_S = 1e6
"""Objective of a layout that does not fit, per unit of memory needed over memory usable."""


class OptunaSearch:
    """Tree-structured Parzen estimator over the space's axes."""

    name: ClassVar[str] = "optuna"

    def __init__(self, *, storage: str | None = None, study_name: str | None = None) -> None:
        self.storage = storage
        self.study_name = study_name

    def search(
        self,
        space: SearchSpace,
        evaluate: Evaluator,
        budget: Budget,
        *,
        seed: int,
        progress: Progress | None = None,
        keep: int | None = None,
    ) -> SearchResult:
        """Ask, evaluate, tell until the budget is spent; return the fastest ``keep`` feasible
        layouts the study holds (None: all)."""
        lib = optuna_module()
        study = lib.create_study(
            study_name=self.study_name or study_name_for(space, evaluate),
            storage=self.storage,
            sampler=lib.samplers.TPESampler(seed=seed, multivariate=True),
            direction="minimize",
            load_if_exists=True,
        )
        trials = budget.max_trials if budget.max_trials is not None else DEFAULT_TRIALS
        start, asked = time.perf_counter(), 0
        while asked < trials:
            if budget.max_time_s is not None and time.perf_counter() - start >= budget.max_time_s:
                break
            if asked >= trials * (1 - LOCAL_SHARE) and (params := _next_neighbour(study, space)) is not None:
                study.enqueue_trial(params)
            trial = study.ask()
            asked += 1
            try:
                layout, est = _fastest(_suggest(trial, space), evaluate)
            except DoesNotFitError as e:
                # Worse than any layout that fits, and the more so the further it is from fitting,
                # so the sampler learns where memory runs out.
                trial.set_user_attr("reason", str(e))
                study.tell(trial, DOES_NOT_FIT_PENALTY_S * e.needed_bytes / e.usable_bytes)
            except (InfeasibleConfigError, SchemaError) as e:
                trial.set_user_attr("reason", str(e))
                study.tell(trial, state=lib.trial.TrialState.FAIL)
            else:
                trial.set_user_attr("layout", json.dumps(asdict(layout)))
                study.tell(trial, est.step_time_s)
            if progress is not None:
                progress(asked, trials)
        found = {}
        for frozen in study.get_trials(deepcopy=False, states=(lib.trial.TrialState.COMPLETE,)):
            if "layout" not in frozen.user_attrs:
                continue  # did not fit
            layout = _layout_from_json(frozen.user_attrs["layout"])
            if layout not in found:
                found[layout] = Candidate(layout, evaluate(layout))
        return SearchResult(
            strategy=self.name, feasible=fastest_first(list(found.values()), keep), evaluated=asked, complete=False
        )


def study_name_for(space: SearchSpace, evaluate: Evaluator) -> str:
    """A name that is the same exactly when the inputs are: resuming continues the right study."""
    key = json.dumps(
        {
            "model": space.model.model_dump(mode="json"),
            "training": space.training.model_dump(mode="json"),
            "cluster": evaluate.cluster.model_dump(mode="json"),
            "margin": evaluate.memory_margin,
            **({"offload": True} if evaluate.offload else {}),  # its trials' layouts differ; others keep their name
        },
        sort_keys=True,
    )
    return f"planner-{space.model.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _suggest(trial: "optuna.trial.BaseTrial", space: SearchSpace) -> list[tuple[Layout, ...]]:
    """Sample a layout from the space's axes, each conditional on the ones before it
    (define-by-run), so that nearly every trial is a valid layout. An axis with one valid value
    is not a parameter; the others are named after the choices they offer (``Axis.parameter_name``).
    An axis ``tried_in_full`` is not sampled: the trial holds one layout per valid value of it.
    Nor is the last axis, recompute: each of those layouts comes as its group
    (``SearchSpace.groups``), in recompute order, whose first that fits is its fastest."""
    *outer, last = space.axes
    partial: list[dict[str, Choice]] = [{}]
    for axis in outer:
        options = axis.choices(space, partial[0])
        if not options:
            given = ", ".join(f"{name}={partial[0][name]}" for name in axis.depends_on)
            raise InfeasibleConfigError(f"no valid {axis.name} given {given}")
        if axis.tried_in_full:  # each layout so far with each value valid for it (only such axes depend on one)
            partial = [{**chosen, axis.name: value} for chosen in partial for value in axis.choices(space, chosen)]
            continue
        if len(options) == 1:
            picked_value = options[0]
        else:
            # Optuna stores plain values; enums go in as their int or str and come back by position.
            plain: list[bool | int | float | str | None] = [_plain(value) for value in options]
            picked = trial.suggest_categorical(axis.parameter_name(options), plain)
            picked_value = options[plain.index(picked)]
        partial = [{**chosen, axis.name: picked_value} for chosen in partial]
    groups = [tuple(space.layout({**chosen, last.name: v}) for v in last.choices(space, chosen)) for chosen in partial]
    if not all(groups):
        raise InfeasibleConfigError(f"no valid {last.name}")
    return groups


def _next_neighbour(study: "optuna.Study", space: SearchSpace) -> dict[str, bool | int | float | str | None] | None:
    """The parameters of the first neighbour of the study's fastest trial that no trial has
    tried; None when there is none (or no trial fits yet)."""
    done = study.get_trials(deepcopy=False, states=(optuna_module().trial.TrialState.COMPLETE,))
    fitting = [t for t in done if "layout" in t.user_attrs]
    if not fitting:
        return None
    best = min(fitting, key=lambda t: t.values[0])
    tried = {frozenset(t.params.items()) for t in study.get_trials(deepcopy=False)}
    return next((p for p in _neighbours(best.params, space) if frozenset(p.items()) not in tried), None)


def _neighbours(params: dict[str, Any], space: SearchSpace) -> Iterator[dict[str, bool | int | float | str | None]]:
    """The parameters of the trials that change one sampled axis of the trial with ``params`` to
    another valid value, in axis order, the later axes keeping their values where still valid and
    taking their first valid value where not."""
    *outer, _ = space.axes
    base: dict[str, Choice] = {}
    for axis in outer:  # the trial's values, back from its parameters (as _suggest chose them)
        options = axis.choices(space, base)
        name = axis.parameter_name(options)
        base[axis.name] = options[[_plain(v) for v in options].index(params[name])] if name in params else options[0]
    for i, moved in enumerate(outer):
        if moved.tried_in_full:
            continue
        for value in moved.choices(space, base):
            if value == base[moved.name]:
                continue
            chosen: dict[str, Choice] = {}
            neighbour: dict[str, bool | int | float | str | None] = {}
            for j, axis in enumerate(outer):
                options = axis.choices(space, chosen)
                if not options:
                    break
                pick = value if j == i else base[axis.name] if base[axis.name] in options else options[0]
                chosen[axis.name] = pick
                if not axis.tried_in_full and len(options) > 1:
                    neighbour[axis.parameter_name(options)] = _plain(pick)
            else:
                yield neighbour


def _fastest(groups: list[tuple[Layout, ...]], evaluate: Evaluator) -> tuple[Layout, Estimate]:
    """The fastest of a trial's layouts that fits, taking of each group the first that fits;
    raises the nearest miss's DoesNotFitError when none fits."""
    fits: list[tuple[Layout, Estimate]] = []
    misses: list[DoesNotFitError] = []
    for group in groups:
        for given in group:
            fitted = len(fits)
            for layout in evaluate.offers(given):  # with its least offloads that fit, in an offload search
                try:
                    fits.append((layout, evaluate(layout)))
                except DoesNotFitError as e:
                    misses.append(e)
            if len(fits) > fitted:
                break
    if fits:
        return min(fits, key=lambda pair: pair[1].step_time_s)
    raise min(misses, key=lambda e: e.needed_bytes)


def _plain(value: Choice) -> bool | int | str:
    if isinstance(value, bool):
        return value
    return int(value) if isinstance(value, int) else str(value)


def _layout_from_json(text: str) -> Layout:
    raw = json.loads(text)
    raw["layer_split"] = tuple(raw["layer_split"]) if raw["layer_split"] is not None else None
    return Layout(**raw)
