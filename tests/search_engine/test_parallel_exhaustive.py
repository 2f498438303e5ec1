"""The exhaustive search split over forked workers returns what the serial search returns: the
same candidates in the same order, the same count of layouts asked and the same closest miss
(``planner.search_engine.exhaustive``)."""

import pytest

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import TrainingSpec
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.axes import AXES, DEGREE_AXES
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.runner import explain_infeasible
from planner.search_engine.space import SearchSpace

MIXTRAL = load_model("mixtral-8x7b")


@pytest.mark.parametrize(
    ("cluster", "batch", "seq_len"),
    [("dgx-h100:2", 8, 2048), ("dgx-h100:1", 64, 1024)],
    ids=["fits", "infeasible"],
)
def test_workers_find_what_one_process_finds(cluster: str, batch: int, seq_len: int) -> None:
    profile = load_cluster(cluster)
    training = TrainingSpec(global_batch_size=batch, seq_len=seq_len)
    space = SearchSpace(
        model=MIXTRAL, training=training, world_size=profile.world_size, devices_per_node=profile.devices_per_node
    )
    serial, parallel = Evaluator(MIXTRAL, training, profile), Evaluator(MIXTRAL, training, profile)
    want = ExhaustiveSearch(processes=1).search(space, serial, Budget(), seed=0)
    seen: list[tuple[int, int | None]] = []
    got = ExhaustiveSearch(processes=3, min_parallel_blocks=0).search(
        space, parallel, Budget(), seed=0, progress=lambda done, total: seen.append((done, total))
    )
    assert [(c.layout, c.estimate) for c in got.feasible] == [(c.layout, c.estimate) for c in want.feasible]
    assert (got.evaluated, got.complete) == (want.evaluated, want.complete)
    # Both counted the space on their way, as its own count does.
    assert got.space_size == want.space_size == space.size() == sum(1 for _ in space.candidates())
    # Which layouts the closest miss so far rules out differs per worker; what was asked does not.
    assert parallel.evaluations + parallel.ruled_out == serial.evaluations + serial.ruled_out == want.evaluated
    assert parallel.closest_miss == serial.closest_miss
    assert seen[-1][0] == seen[-1][1]  # progress ends at the whole space
    # The workers' blocks hold the space's groups, in its order.
    assert [group for block in space.blocks() for group in space.groups(block)] == list(space.groups())
    assert [axis.name for axis in AXES[: len(DEGREE_AXES)]] == list(DEGREE_AXES)
    if not want.feasible:
        assert explain_infeasible(space, parallel) == explain_infeasible(space, serial)
        return
    # Asked for the fastest few, the workers send back only theirs; the merge is the serial head.
    keep = 3
    few = ExhaustiveSearch(processes=3, min_parallel_blocks=0).search(
        space, Evaluator(MIXTRAL, training, profile), Budget(), seed=0, keep=keep
    )
    assert len(want.feasible) > keep
    assert [(c.layout, c.estimate) for c in few.feasible] == [(c.layout, c.estimate) for c in want.feasible[:keep]]
    assert few.evaluated < want.evaluated  # the step-time floor ruled some out (test_step_floor_pruning)
    # A search cut short by its budget has not walked the whole space: it does not count it.
    assert ExhaustiveSearch(processes=1).search(space, serial, Budget(max_trials=2), seed=0).space_size is None


def test_a_layout_budget_runs_serially_and_a_small_space_stays_in_process() -> None:
    search = ExhaustiveSearch(processes=4, min_parallel_blocks=100)
    assert search._processes_for(99, Budget()) == 1
    assert search._processes_for(100, Budget(max_trials=10)) == 1
    assert search._processes_for(100, Budget()) == 4
    assert search._processes_for(3, Budget()) == 1
