"""The search chooses how many layers each pipeline stage recomputes (``Layout.recompute_layers``):
CP-SAT splits layers and recompute together as exhaustively as enumeration does; the scan offers
the fewest recomputed layers that fit, only where the layout does not fit without recompute and
the constraints leave full recompute in."""

import itertools
import math
from dataclasses import replace

import pytest

from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, Recompute, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import stage_layers
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine.evaluate import Evaluator, RecomputeCosts, SplitCosts
from planner.search_engine.layer_split import balance_split

COSTS = SplitCosts(
    time_base_s=(0.2, 0.0, 0.0, 0.3),
    time_per_layer_s=(1.0, 1.0, 1.0, 1.0),
    memory_base_bytes=(2e8, 1e8, 1e8, 3e8),
    memory_per_layer_bytes=(8e8, 6e8, 4e8, 2e8),  # the first stage holds the most micro-batches in flight
    recompute=RecomputeCosts(
        time_per_layer_s=(0.33, 0.33, 0.33, 0.33),
        memory_saved_per_layer_bytes=(6e8, 4.4e8, 2.8e8, 1.2e8),
        memory_rebuilt_bytes=(1e8, 1e8, 1e8, 1e8),
    ),
)


def _enumerate(costs: SplitCosts, layers: int, usable: float) -> float | None:
    """The slowest stage of the best split and counts, by trying them all."""
    rc, p, best = costs.recompute, len(costs.time_base_s), None
    assert rc is not None
    for split in itertools.product(range(1, layers + 1), repeat=p):
        if sum(split) != layers:
            continue
        for again in itertools.product(*(range(n + 1) for n in split)):
            memory = [
                costs.memory_base_bytes[s]
                + costs.memory_per_layer_bytes[s] * n
                - rc.memory_saved_per_layer_bytes[s] * r
                + (rc.memory_rebuilt_bytes[s] if r == n else 0.0)
                for s, (n, r) in enumerate(zip(split, again, strict=True))
            ]
            if any(m > usable for m in memory):
                continue
            slowest = max(
                costs.time_base_s[s] + costs.time_per_layer_s[s] * n + rc.time_per_layer_s[s] * r
                for s, (n, r) in enumerate(zip(split, again, strict=True))
            )
            best = slowest if best is None else min(best, slowest)
    return best


@pytest.mark.parametrize("usable", [5.01e9, 2.61e9, 1.61e9, 1.01e9, 0.51e9])
def test_cp_sat_splits_layers_and_recompute_as_enumeration_does(usable: float) -> None:
    split = balance_split(COSTS, 12, usable, Budget(max_time_s=5))
    best = _enumerate(COSTS, 12, usable)
    if best is None:
        assert split is None
        return
    assert split is not None and split.recompute_layers is not None and sum(split.layers) == 12
    rc = COSTS.recompute
    assert rc is not None
    slowest = max(
        COSTS.time_base_s[s] + COSTS.time_per_layer_s[s] * n + rc.time_per_layer_s[s] * r
        for s, (n, r) in enumerate(zip(split.layers, split.recompute_layers, strict=True))
    )
    assert slowest == pytest.approx(best, abs=1e-6)
    assert all(0 <= r <= n for n, r in zip(split.layers, split.recompute_layers, strict=True))


def test_memory_that_needs_it_recomputes_most_where_most_is_in_flight() -> None:
    split = balance_split(COSTS, 12, 1.6e9, Budget(max_time_s=5))
    assert split is not None and split.recompute_layers is not None
    assert split.recompute_layers[0] > 0 and split.recompute_layers[-1] == 0
    assert list(split.recompute_layers) == sorted(split.recompute_layers, reverse=True)


LLAMA, CLUSTER = load_model("llama3-70b"), load_cluster("dgx-h100:4")
TRAINING = TrainingSpec(global_batch_size=256, seq_len=4096)


def test_the_fewest_layers_that_fit() -> None:
    """From a pipeline that does not fit without recompute: each stage recomputes the fewest of
    its first layers that fit; one fewer on any stage does not fit."""
    evaluate = Evaluator(LLAMA, TRAINING, CLUSTER)
    layout = Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=4,
        pipeline_parallel_degree=4,
        micro_batch_size=2,
        zero_stage=1,
        sequence_parallel=True,
    )
    with pytest.raises(InfeasibleConfigError):
        evaluate(layout)
    partial = evaluate.least_recompute(layout)
    assert partial is not None and partial.recompute is Recompute.FULL and partial.recompute_layers is not None
    assert evaluate(partial).peak_memory_bytes <= evaluate.usable_memory_bytes
    held = stage_layers(LLAMA, layout)
    assert 0 < sum(partial.recompute_layers) < sum(held)
    for stage, r in enumerate(partial.recompute_layers):
        if r:
            fewer = tuple(c - (s == stage) for s, c in enumerate(partial.recompute_layers))
            with pytest.raises(InfeasibleConfigError):
                evaluate(replace(partial, recompute_layers=fewer))


def test_the_search_offers_it_only_where_nothing_less_fits_and_full_recompute_is_allowed() -> None:
    evaluate = Evaluator(LLAMA, TRAINING, CLUSTER)
    plans = api.search(LLAMA, CLUSTER, TRAINING, SearchSettings(top_k=5, constraints={"zero_stage": [0, 1]}))
    partial = [p.layout for p in plans if p.layout.recompute_layers is not None]
    assert partial, [p.layout.describe() for p in plans]
    for layout in partial:
        with pytest.raises(InfeasibleConfigError):  # (its counts are CP-SAT's on the refined split)
            evaluate(replace(layout, recompute_layers=(0,) * layout.pipeline_parallel_degree))
    selective = api.search(
        LLAMA,
        CLUSTER,
        TRAINING,
        SearchSettings(top_k=5, constraints={"zero_stage": [0, 1], "recompute": ["none", "selective"]}),
    )
    assert all(p.layout.recompute_layers is None for p in selective)
    assert math.isfinite(selective[0].estimate.step_time_s)


def test_the_recompute_costs_are_affine_in_the_recomputed_layers() -> None:
    """What CP-SAT is given reproduces each stage's memory for any split and counts, every layer
    of a stage recomputed (the rebuilt layer then added) or not."""
    evaluate = Evaluator(LLAMA, TRAINING, CLUSTER)
    layout = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=8,
        pipeline_parallel_degree=4,
        micro_batch_size=1,
        sequence_parallel=True,
        recompute=Recompute.FULL,
    )
    costs = evaluate.split_costs(layout, partial_recompute=True)
    rc = costs.recompute
    assert rc is not None
    split = (18, 21, 21, 20)
    for counts in [(10, 5, 21, 0), (18, 0, 0, 20)]:
        est = evaluate.memory(replace(layout, layer_split=split, recompute_layers=counts))
        for s, (n, r) in enumerate(zip(split, counts, strict=True)):
            predicted = (
                costs.memory_base_bytes[s]
                + costs.memory_per_layer_bytes[s] * n
                - rc.memory_saved_per_layer_bytes[s] * r
                + (rc.memory_rebuilt_bytes[s] if r == n else 0.0)
            )
            assert est[s].total_bytes == pytest.approx(predicted, rel=1e-9)
