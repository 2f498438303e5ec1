"""One declaration of the space: what Optuna samples is what the exhaustive strategy iterates,
and the expert-parallel degree is an axis of MoE models only."""

import optuna
import pytest

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch, OptunaSearch
from planner.search_engine.axes import AXES, divisors
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.optuna_search import _neighbours, _suggest
from planner.search_engine.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _space(model: str, world: int, batch: int = 4) -> SearchSpace:
    training = TrainingSpec(global_batch_size=batch, seq_len=64)
    return SearchSpace(model=load_model(model), training=training, world_size=world, devices_per_node=8)


def _sampled(space: SearchSpace, trials: int, sampler: optuna.samplers.BaseSampler) -> set[Layout]:
    study = optuna.create_study(sampler=sampler)
    seen = set()
    for _ in range(trials):
        trial = study.ask()
        for group in _suggest(trial, space):  # a tried-in-full axis: every value in one trial
            seen.update(group)  # and every value of recompute, tried in order
        study.tell(trial, float(len(seen)))  # any objective: only what can be sampled matters
    return seen


def test_every_axis_depends_only_on_earlier_axes() -> None:
    names = [axis.name for axis in AXES]
    assert len(set(names)) == len(names)
    for i, axis in enumerate(AXES):
        assert set(axis.depends_on) <= set(names[:i]), axis.name
    assert {axis.field for axis in AXES} <= set(Layout.__dataclass_fields__)
    assert AXES[-1].name == "recompute"  # the exhaustive strategy groups by it
    # A trial holds one layout per value of a tried-in-full axis, so only another tried-in-full axis
    # (whose values are taken for each of those layouts) may depend on one.
    full = {axis.name for axis in AXES if axis.tried_in_full}
    assert not any(full & set(axis.depends_on) for axis in AXES if not axis.tried_in_full)


@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-moe"])
def test_optuna_samples_exactly_the_exhaustive_candidates_of_a_small_space(model: str) -> None:
    space = _space(model, world=2)
    candidates = set(space.candidates())
    assert len(candidates) == space.size()
    sampled = _sampled(space, 3000, optuna.samplers.RandomSampler(seed=0))
    assert sampled == candidates


def test_a_trials_neighbours_change_one_sampled_axis_each_and_are_valid_trials() -> None:
    space = _space("tiny-gpt", world=8, batch=16)
    candidates = set(space.candidates())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    base = study.ask()
    _suggest(base, space)
    trial = optuna.trial.FixedTrial(base.params)
    (layout, *_), *_ = _suggest(trial, space)
    firsts, seen = [], set()
    for params in _neighbours(base.params, space):
        groups = _suggest(optuna.trial.FixedTrial(params), space)  # every parameter it asks for is given
        assert {lay for group in groups for lay in group} <= candidates
        assert frozenset(params.items()) not in seen and params != base.params
        seen.add(frozenset(params.items()))
        # The first axis on which it differs is a sampled one; the axes before it are the base's.
        first = next(a for a in AXES if getattr(groups[0][0], a.field) != getattr(layout, a.field))
        assert not first.tried_in_full and first is not AXES[-1]
        firsts.append(first.name)
    # tp, the first axis, takes each of its other values once, in one neighbour each.
    assert firsts.count("tp") == len(space.choices("tp")) - 1 >= 1
    assert {lay.tensor_parallel_degree for lay in candidates} == {layout.tensor_parallel_degree} | {
        next(iter(_suggest(optuna.trial.FixedTrial(p), space)))[0].tensor_parallel_degree
        for p, name in zip(_neighbours(base.params, space), firsts, strict=True)
        if name == "tp"
    }


def test_what_optunas_tpe_search_finds_is_in_the_exhaustive_candidates() -> None:
    model, cluster = load_model("tiny-moe"), load_cluster("dgx-a100-80g:1")
    training = TrainingSpec(global_batch_size=16, seq_len=64)
    space = SearchSpace(model=model, training=training, world_size=8, devices_per_node=8)
    result = OptunaSearch().search(space, Evaluator(model, training, cluster), Budget(max_trials=150), seed=3)
    assert result.feasible
    assert {c.layout for c in result.feasible} <= set(space.candidates())


def test_a_moe_model_searches_expert_parallel_degrees_and_a_dense_one_does_not() -> None:
    moe = _space("tiny-moe", world=8, batch=16)
    experts = moe.model.num_local_experts
    eps = {(c.expert_ranks, c.folds_experts, c.expert_parallel_degree) for c in moe.candidates()}
    assert any(ep > 1 for *_, ep in eps) and any(folded for _, folded, _ in eps)
    # Every ep that divides both the expert count and dp (or, experts folded, dp x tp), and no other.
    for ranks, folded in {(ranks, folded) for ranks, folded, _ in eps}:
        assert {ep for r, f, ep in eps if (r, f) == (ranks, folded)} == {e for e in divisors(ranks) if experts % e == 0}
    dense = _space("tiny-gpt", world=8, batch=16)
    assert {c.expert_parallel_degree for c in dense.candidates()} == {1}
    assert not any(c.folds_experts for c in dense.candidates())
    assert moe.choices("ep", tp=1, dp=8, cp=1, etp=1) == [1, 2, 4]  # tiny-moe has 4 experts
    assert moe.choices("ep", tp=2, dp=1, cp=1, etp=2) == [1] and moe.choices("ep", tp=2, dp=1, cp=1, etp=1) == [1, 2]
    assert dense.choices("ep", tp=1, dp=8, cp=1, etp=1) == [1]
    assert moe.choices("etp", tp=2, cp=1) == (2, 1) and moe.choices("etp", tp=1, cp=1) == (1,)
    assert dense.choices("etp", tp=2, cp=1) == (2,)
    assert moe.choices("sequence_parallel", tp=2, cp=1, etp=1) == [True]


def test_expert_parallel_layouts_are_priced() -> None:
    model, cluster = load_model("tiny-moe"), load_cluster("dgx-a100-80g:1")
    training = TrainingSpec(global_batch_size=16, seq_len=64)
    space = SearchSpace(model=model, training=training, world_size=8, devices_per_node=8)
    result = ExhaustiveSearch().search(space, Evaluator(model, training, cluster), Budget(), seed=0)
    assert {c.layout.expert_parallel_degree for c in result.feasible} == {1, 2, 4}
