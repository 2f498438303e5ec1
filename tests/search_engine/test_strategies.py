"""One conformance suite for every strategy, the CP-SAT split against enumeration, Optuna
against the exhaustive optimum, resumable Optuna studies, and infeasible searches explained."""

import itertools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import optuna
import pytest

from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import DType, ModelSpec, PipelineBuffers, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch, OptunaSearch
from planner.search_engine.evaluate import Evaluator, SplitCosts
from planner.search_engine.layer_split import balance_layers
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import SearchStrategy

optuna.logging.set_verbosity(optuna.logging.WARNING)
MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-a100-80g:2")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=4096)


def _space() -> SearchSpace:
    return SearchSpace(model=MODEL, training=TRAINING, world_size=16, devices_per_node=8)


@pytest.mark.parametrize("strategy", [ExhaustiveSearch(), OptunaSearch()], ids=lambda s: s.name)
def test_strategy_returns_only_fitting_layouts_fastest_first(strategy: SearchStrategy) -> None:
    evaluate = Evaluator(MODEL, TRAINING, CLUSTER)
    result = strategy.search(_space(), evaluate, Budget(max_trials=200), seed=1)
    assert result.strategy == strategy.name and result.feasible
    times = [c.estimate.step_time_s for c in result.feasible]
    assert times == sorted(times)
    for c in result.feasible:
        assert c.estimate.peak_memory_bytes <= evaluate.usable_memory_bytes
        assert c.layout.world_size == CLUSTER.world_size
    assert result.evaluated <= 200


@pytest.mark.parametrize("strategy", [ExhaustiveSearch(), OptunaSearch()], ids=lambda s: s.name)
def test_strategy_is_deterministic_for_a_seed(strategy: SearchStrategy) -> None:
    runs = [
        strategy.search(_space(), Evaluator(MODEL, TRAINING, CLUSTER), Budget(max_trials=60), seed=7) for _ in range(2)
    ]
    assert [c.layout for c in runs[0].feasible] == [c.layout for c in runs[1].feasible]


def _enumerate(costs: SplitCosts, layers: int, usable: float) -> tuple[float, tuple[int, ...]] | None:
    p, best = len(costs.time_base_s), None
    for split in itertools.product(range(1, layers + 1), repeat=p):
        if sum(split) != layers:
            continue
        if any(costs.memory_base_bytes[s] + costs.memory_per_layer_bytes[s] * n > usable for s, n in enumerate(split)):
            continue
        slowest = max(costs.time_base_s[s] + costs.time_per_layer_s[s] * n for s, n in enumerate(split))
        if best is None or slowest < best[0]:
            best = (slowest, split)
    return best


@pytest.mark.parametrize(
    ("base", "per", "mem_base", "usable", "layers"),
    [
        ((0.3, 0.0, 0.0, 0.9), (1.0, 1.0, 1.0, 1.0), (0, 0, 0, 0), 1e9, 12),  # heavy first and last stage
        ((0.0, 0.0, 0.0), (1.0, 2.0, 1.0), (0, 0, 0), 1e9, 10),  # a slow stage
        ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (6e8, 0, 0), 1e9, 9),  # memory caps the first stage
        ((0.5, 0.1, 0.7), (0.9, 1.1, 1.0), (1e8, 2e8, 3e8), 8e8, 11),
    ],
)
def test_cp_sat_split_matches_enumeration(
    base: tuple[float, ...], per: tuple[float, ...], mem_base: tuple[float, ...], usable: float, layers: int
) -> None:
    costs = SplitCosts(
        time_base_s=base, time_per_layer_s=per, memory_base_bytes=mem_base, memory_per_layer_bytes=(1e8,) * len(base)
    )
    split = balance_layers(costs, layers, usable, Budget(max_time_s=5))
    reference = _enumerate(costs, layers, usable)
    assert reference is not None and split is not None
    slowest = max(base[s] + per[s] * n for s, n in enumerate(split))
    assert sum(split) == layers
    assert slowest == pytest.approx(reference[0], abs=1e-6)


def test_cp_sat_split_reports_no_fit() -> None:
    costs = SplitCosts(
        time_base_s=(0, 0), time_per_layer_s=(1, 1), memory_base_bytes=(9e8, 9e8), memory_per_layer_bytes=(1e8, 1e8)
    )
    assert balance_layers(costs, 4, 1e9, Budget(max_time_s=5)) is None


def test_split_costs_are_affine_in_the_layer_count() -> None:
    from dataclasses import replace

    from planner.schemas import Layout

    evaluate = Evaluator(MODEL, TRAINING, CLUSTER)
    layout = Layout(
        data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=4, micro_batch_size=1, zero_stage=1
    )
    costs = evaluate.split_costs(layout)
    split = (5, 9, 10, 8)
    est = evaluate(replace(layout, layer_split=split))
    for s, n in enumerate(split):
        predicted = costs.memory_base_bytes[s] + costs.memory_per_layer_bytes[s] * n
        assert est.stages[s].memory.total_bytes == pytest.approx(predicted, rel=1e-9)


QUALITY_SEEDS = range(5)
QUALITY_LANDSCAPES = {"fp32-sums": None, "bf16-sums": DType.BF16}
"""The Optuna quality test's seeds, and its landscapes: gradients summed in fp32 (the default
under bf16) and in bf16."""


def _quality_step_time_s(landscape: str, seed: int | None) -> float:
    """The fastest step time found on llama3-70b over 64 A100s with gradients summed as
    ``landscape`` says: by the exhaustive search (``seed`` None), or by Optuna in 400 trials."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-a100-80g:8")
    training = TrainingSpec(
        global_batch_size=256,
        seq_len=4096,
        grad_reduce_dtype=QUALITY_LANDSCAPES[landscape],
        pipeline_buffers=PipelineBuffers.PER_TRANSFER,
    )
    space = SearchSpace(model=model, training=training, world_size=64, devices_per_node=8)
    evaluate = Evaluator(model, training, cluster)
    if seed is None:
        return ExhaustiveSearch().search(space, evaluate, Budget(), seed=0).feasible[0].estimate.step_time_s
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return OptunaSearch().search(space, evaluate, Budget(max_trials=400), seed=seed).feasible[0].estimate.step_time_s


@pytest.fixture(scope="module")
def optuna_quality_ratios() -> dict[str, list[float]]:
    """Per landscape, the 5 seeds' best step times over the exhaustive optimum, sorted. The 12
    searches (each seconds of one core, mostly Optuna's sampler) run in a pool of one process per
    core, longest first: the two landscapes took 50 s each one after the other on a 2-core machine."""
    jobs: list[tuple[str, int | None]] = [(name, seed) for seed in QUALITY_SEEDS for name in QUALITY_LANDSCAPES]
    jobs += [(name, None) for name in QUALITY_LANDSCAPES]
    workers = min(len(jobs), len(os.sched_getaffinity(0)))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        times = dict(zip(jobs, pool.map(_quality_step_time_s, *zip(*jobs, strict=True)), strict=True))
    return {
        name: sorted(times[name, seed] / times[name, None] for seed in QUALITY_SEEDS) for name in QUALITY_LANDSCAPES
    }


@pytest.mark.slow
@pytest.mark.parametrize("landscape", list(QUALITY_LANDSCAPES))
def test_optuna_reaches_2_percent_of_the_exhaustive_optimum_in_400_trials(
    landscape: str, optuna_quality_ratios: dict[str, list[float]]
) -> None:
    # A mid-size case: llama3-70b on 64 A100s, 24,516 candidates, 15 of them within 2% of the
    # optimum (dp8 tp4 pp2 zero1 interleaved). The sampler is random. Seeds 0-4 reach 1.0, 1.0, 1.0,
    # 1.0259 and 1.0 of the optimum with gradients summed in fp32 (the default under bf16), 1.0,
    # 1.0, 1.0, 1.006 and 1.0 summed in bf16; with recompute sampled and no local search they
    # reached 1.0, 1.0079, 1.0259, 1.0295 and 1.0296 (fp32), 1.0, 1.0553, 1.006, 1.0311 and 1.0
    # (bf16). Over seeds 0-19 (fp32) the mean is 1.0099 (was 1.0236) and 14 come within 2% (were
    # 8): the median seed must come within 2% and none beyond 6%. Those figures are of pipelines
    # receiving per transfer (with torch's buffers kept per micro-batch, bf16, the worst seed reached 1.067).
    ratios = optuna_quality_ratios[landscape]
    assert ratios[2] <= 1.02, ratios
    assert ratios[-1] <= 1.06, ratios


def test_an_interrupted_optuna_search_keeps_its_finished_trials(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    first = OptunaSearch(storage=storage).search(
        _space(), Evaluator(MODEL, TRAINING, CLUSTER), Budget(max_trials=15), seed=0
    )
    second = OptunaSearch(storage=storage).search(
        _space(), Evaluator(MODEL, TRAINING, CLUSTER), Budget(max_trials=10), seed=1
    )
    (summary,) = optuna.get_all_study_summaries(storage)
    assert summary.n_trials == 25
    assert {c.layout for c in first.feasible} <= {c.layout for c in second.feasible}


def test_optunas_last_quarter_of_trials_tries_the_fastest_trials_neighbours(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    OptunaSearch(storage=storage, study_name="s").search(
        _space(), Evaluator(MODEL, TRAINING, CLUSTER), Budget(max_trials=40), seed=0
    )
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    enqueued = ["fixed_params" in t.system_attrs for t in trials]
    assert len(trials) == 40 and not any(enqueued[:30]) and any(enqueued[30:])
    # Each neighbour asked for moves one sampled axis of a trial before it: it differs from the
    # fastest earlier trial in one parameter value at least and shares some.
    for i, trial in enumerate(trials[30:], start=30):
        if enqueued[i]:
            fitting = [t for t in trials[:i] if "layout" in t.user_attrs]
            best = min(fitting, key=lambda t: t.values[0])
            assert trial.params != best.params and set(trial.params.items()) & set(best.params.items())


def test_nothing_fits_is_explained() -> None:
    training = TrainingSpec(global_batch_size=8, seq_len=8192)
    with pytest.raises(InfeasibleConfigError) as info:
        api.search("llama3-405b", "dgx-a100-80g:1", training, api.SearchSettings(optimizer_offload=False))
    message = str(info.value)
    assert "no layout of 'llama3-405b' fits" in message and "closest" in message
    assert "more devices" in message and "GiB" in message
    # The closest has one replica, which ZeRO cannot shard: no ZeRO stage is suggested.
    assert "The closest, dp1 " in message and "ZeRO" not in message
    # With an offload, what fits the GPUs needs more host memory than the node has: more nodes, and how many
    with pytest.raises(InfeasibleConfigError) as info:
        api.search("llama3-405b", "dgx-a100-80g:1", training)
    message = str(info.value)
    assert "GiB of host memory per node" in message and "more nodes for the hosts' memory (at least about" in message
    assert "most of it host" not in message


def test_search_with_no_valid_degrees_is_explained() -> None:
    odd = ModelSpec(name="odd", hidden_size=96, num_hidden_layers=1, num_attention_heads=3, vocab_size=64)
    with pytest.raises(InfeasibleConfigError, match="no valid layout"):
        api.search(odd, "dgx-a100-80g:1", TrainingSpec(global_batch_size=3, seq_len=64))
