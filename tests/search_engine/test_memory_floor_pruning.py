"""The exhaustive strategy skips layouts whose model states alone do not fit
(``Evaluator.cannot_fit``): the floor it prunes with bounds every stage's memory, is shared by the
layouts it is memoized over, and pruning changes nothing the search returns."""

import dataclasses
from collections import defaultdict
from datetime import datetime

import pytest

from cost_models.memory import stage_memory, stage_memory_floor
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Calibration, ClusterProfile, Layout, TrainingSpec
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.evaluate import FLOOR_FREE_FIELDS, Evaluator
from planner.search_engine.runner import explain_infeasible
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import SearchResult

MIXTRAL = load_model("mixtral-8x7b")


class _Unpruned(Evaluator):
    """An evaluator that rules nothing out: every layout is checked in full."""

    def cannot_fit(self, layout: Layout) -> bool:
        return False


def _calibrated(cluster: ClusterProfile) -> ClusterProfile:
    # A calibration may scale terms down and count less overhead than the model (negative).
    calibration = Calibration(
        activation_memory_scale=0.5,
        logits_memory_scale=0.5,  # what the backward's transients and gradients fill of the loss shrinks too
        buffer_memory_scale=0.0,
        memory_overhead_bytes=-(2**30),
        created=datetime(2026, 1, 1),
        trials=0,
        memory_samples=0,
    )
    return cluster.model_copy(update={"calibration": calibration})


@pytest.mark.parametrize("calibrated", [False, True], ids=["preset", "calibrated"])
def test_the_floor_bounds_every_stage_and_is_the_same_across_the_fields_it_ignores(calibrated: bool) -> None:
    cluster = load_cluster("dgx-h100:2")
    cluster = _calibrated(cluster) if calibrated else cluster
    training = TrainingSpec(global_batch_size=32, seq_len=2048)
    space = SearchSpace(model=MIXTRAL, training=training, world_size=16, devices_per_node=8)
    floors: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for i, layout in enumerate(space.candidates()):
        if i % 5:
            continue  # a fifth of the space keeps the test fast and still covers every axis
        for stage in range(layout.pipeline_parallel_degree):
            floor = stage_memory_floor(MIXTRAL, training, cluster, layout, stage).total_bytes
            assert floor <= stage_memory(MIXTRAL, training, cluster, layout, stage).total_bytes
            key = tuple(getattr(layout, f.name) for f in dataclasses.fields(layout) if f.name not in FLOOR_FREE_FIELDS)
            floors[(*key, stage)].append(floor)
    assert sum(map(len, floors.values())) > 100
    assert max(map(len, floors.values())) > 1  # layouts do share a floor
    assert all(len(set(values)) == 1 for values in floors.values())


def _search(evaluator: Evaluator, space: SearchSpace, budget: Budget) -> SearchResult:
    return ExhaustiveSearch().search(space, evaluator, budget, seed=0)


@pytest.mark.parametrize(
    ("cluster", "batch", "seq_len", "budget"),
    [
        ("dgx-h100:2", 8, 2048, Budget()),  # some layouts fit
        ("dgx-h100:2", 8, 2048, Budget(max_trials=400)),  # the budget counts ruled-out layouts as asked
        ("dgx-h100:1", 64, 1024, Budget()),  # none fits: the closest miss explains it
    ],
    ids=["fits", "budget", "infeasible"],
)
def test_pruning_changes_nothing_the_exhaustive_search_returns(
    cluster: str, batch: int, seq_len: int, budget: Budget
) -> None:
    profile = load_cluster(cluster)
    training = TrainingSpec(global_batch_size=batch, seq_len=seq_len)
    space = SearchSpace(
        model=MIXTRAL, training=training, world_size=profile.world_size, devices_per_node=profile.devices_per_node
    )
    pruned, full = Evaluator(MIXTRAL, training, profile), _Unpruned(MIXTRAL, training, profile)
    got, want = _search(pruned, space, budget), _search(full, space, budget)
    assert pruned.ruled_out > 0  # the case exercises the pruning
    assert pruned.evaluations + pruned.ruled_out == full.evaluations
    assert got.evaluated == want.evaluated
    assert got.complete == want.complete
    assert [(c.layout, c.estimate) for c in got.feasible] == [(c.layout, c.estimate) for c in want.feasible]
    assert pruned.closest_miss == full.closest_miss
    if not want.feasible:
        assert explain_infeasible(space, pruned) == explain_infeasible(space, full)
