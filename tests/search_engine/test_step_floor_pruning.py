"""The exhaustive search skips groups whose step-time floor is above the fastest ``keep`` found
so far (``exhaustive._Fastest``): the floor (``cost_models.step_floor``) is below the estimate of
every layout that shares it, and pruning with it changes nothing among the fastest ``keep``."""

from dataclasses import replace

import pytest

from cost_models.estimate import estimate
from cost_models.step_floor import floor_factor, mean_stage_s, relaxed, step_time_floor_s
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import ClusterProfile, ModelSpec, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import num_micro_batches
from planner.schemas.routing import RoutingStats
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.exhaustive import _Fastest
from planner.search_engine.space import AXES, SearchSpace


def _shared_cores(cluster: ClusterProfile) -> ClusterProfile:
    """``cluster`` with its ranks sharing cores (a CPU cluster's profile): the stages' critical
    path shrinks (``cost_models.shared_cores``), which the floor must still bound."""
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"core_share": 0.5})})


def _routing(model: ModelSpec) -> RoutingStats:
    """A skewed trace: expert 0 takes four times the others' tokens in every MoE layer."""
    experts = model.num_local_experts
    counts = [[4 * 64 if e == 0 else 64 for e in range(experts)] for _ in range(model.num_moe_layers)]
    return RoutingStats.from_counts(
        model=model.name,
        expert_tokens=counts,
        coactivation=[[[0] * experts] * experts] * (len(counts) - 1),
        experts_per_token=model.num_experts_per_tok,
        routed_tokens=sum(counts[0]) // model.num_experts_per_tok,
    )


CASES = {
    # MoE, 16 GPUs: expert, tensor and pipeline parallelism, interleaving, the split vocabulary.
    "mixtral-h100": ("mixtral-8x7b", "dgx-h100:2", TrainingSpec(global_batch_size=32, seq_len=2048), False),
    # Dense layers beside MoE layers, and an FP8 recipe keeping its first and last layers in bf16.
    "deepseek-fp8": (
        "deepseek-v3",
        "dgx-h100:32",
        TrainingSpec(global_batch_size=256, seq_len=2048, stack="megatron-lm", fp8="tensorwise", fp8_bf16_layers=2),
        False,
    ),
    # Dense, on ranks that share cores, with a routing trace on an MoE model beside it.
    "llama-shared-cores": ("llama3-8b", "dgx-a100-80g:1", TrainingSpec(global_batch_size=16, seq_len=1024), False),
    "mixtral-routed": ("mixtral-8x7b", "dgx-h100:2", TrainingSpec(global_batch_size=32, seq_len=1024), True),
}


def _case(name: str) -> tuple[ModelSpec, ClusterProfile, TrainingSpec, RoutingStats | None]:
    model_name, cluster_name, training, routed = CASES[name]
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    if name == "llama-shared-cores":
        cluster = _shared_cores(cluster)
    return model, cluster, training, _routing(model) if routed else None


@pytest.mark.parametrize("name", list(CASES))
def test_the_floor_is_below_every_estimate_that_shares_it(name: str) -> None:
    model, cluster, training, routing = _case(name)
    space = SearchSpace(
        model=model, training=training, world_size=cluster.world_size, devices_per_node=cluster.devices_per_node
    )
    checked, tight = 0, 0.0
    factors: dict[tuple[object, ...], float] = {}  # the search keeps one factor per FACTOR_BY values
    factor_fields = [axis.field for axis in AXES if axis.name in _Fastest.FACTOR_BY]
    assert len(factor_fields) == len(_Fastest.FACTOR_BY)
    stride = 41 if name == "deepseek-fp8" else 7  # a part of each space still covers every axis's values
    for i, layout in enumerate(space.candidates()):
        if i % stride:
            continue
        try:
            step_s = estimate(model, training, cluster, layout, routing=routing).step_time_s
        except InfeasibleConfigError:
            continue
        floor_s = step_time_floor_s(model, training, cluster, layout, routing)
        assert 0 < floor_s <= step_s * (1 + 1e-12), layout.describe()
        # Every layout that differs only in the relaxed fields shares the mean stage: its relaxed
        # form's; the schedule adds its own bubble (none over one stage or on shared cores).
        mean_s = mean_stage_s(model, training, cluster, layout, routing)
        assert mean_s == mean_stage_s(model, training, cluster, relaxed(layout), routing)
        m = num_micro_batches(training.global_batch_size, layout)
        bubbled = layout.pipeline_parallel_degree > 1 and cluster.device.core_share >= 1
        assert (floor_s > m * mean_s) == bubbled
        factor = floor_factor(training, cluster, layout)
        assert floor_s == mean_s * factor
        assert factors.setdefault(tuple(getattr(layout, f) for f in factor_fields), factor) == factor
        checked, tight = checked + 1, max(tight, floor_s / step_s)
    assert checked > 20
    assert tight > 0.5  # the floor is no empty bound: on some layout it is most of the step


def test_no_floor_on_mixed_devices_or_with_a_calibration() -> None:
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=16, seq_len=1024)
    layout = next(iter(SearchSpace(model=model, training=training, world_size=16, devices_per_node=8).candidates()))
    mixed = load_cluster("dgx-a100-80g:1+dgx-h100:1")
    assert mixed.has_mixed_devices and step_time_floor_s(model, training, mixed, layout) == 0.0
    assert step_time_floor_s(model, training, load_cluster("dgx-h100:2"), layout) > 0.0
    assert step_time_floor_s(model, training, load_cluster("dgx-h100:2"), replace(layout, layer_split=(32,))) == 0.0


@pytest.mark.parametrize("name", ["mixtral-h100", "llama-shared-cores", "mixtral-routed"])
@pytest.mark.parametrize("keep", [1, 4])
def test_pruning_by_the_floor_keeps_the_fastest_the_full_search_finds(name: str, keep: int) -> None:
    model, cluster, training, routing = _case(name)
    space = SearchSpace(
        model=model, training=training, world_size=cluster.world_size, devices_per_node=cluster.devices_per_node
    )
    full = ExhaustiveSearch(processes=1).search(
        space, Evaluator(model, training, cluster, routing=routing), Budget(), seed=0
    )
    pruned = ExhaustiveSearch(processes=1).search(
        space, Evaluator(model, training, cluster, routing=routing), Budget(), seed=0, keep=keep
    )
    assert len(full.feasible) > keep
    assert [(c.layout, c.estimate) for c in pruned.feasible] == [(c.layout, c.estimate) for c in full.feasible[:keep]]
    assert pruned.evaluated < full.evaluated  # the floor ruled some out, and the result says how many
    assert full.outpaced == 0 < pruned.outpaced < pruned.space_size
    assert pruned.space_size == full.space_size == space.size()
