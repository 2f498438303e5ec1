"""The search offloads optimizer states only where nothing fits without: then each layout is tried
with the least share that fits (in twentieths), within the host's memory; where something fits
without, the search is today's."""

from dataclasses import replace

import pytest

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.flows.search import admission
from planner.schemas import HostProfile, Layout, Recompute, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine.evaluate import OFFLOAD_STEPS, Evaluator
from planner.search_engine.exhaustive import ExhaustiveSearch
from planner.search_engine.optuna_search import OptunaSearch
from planner.search_engine.runner import SearchOutcome, run_search

LLAMA = load_model("llama3-70b")
NODE = load_cluster("dgx-h100:1")
FINE_TUNING = TrainingSpec(global_batch_size=64, seq_len=4096)


def _search(cluster: object = NODE, **settings: object) -> SearchOutcome:
    return run_search(LLAMA, FINE_TUNING, cluster, ExhaustiveSearch(processes=1), SearchSettings(**settings))  # type: ignore[arg-type]


def test_llama3_70b_full_fine_tuning_on_one_node_gets_a_plan_with_its_optimizer_offloaded() -> None:
    with pytest.raises(InfeasibleConfigError, match=r"optimizer offload to host memory"):
        _search(optimizer_offload=False)
    best = _search().ranked[0]
    layout, est = best.layout, best.estimate
    assert 0 < layout.optimizer_offload_fraction <= 1 and est.fits and est.fits_host
    assert est.time.optimizer_offload_s > 0 and est.host_memory_per_node_bytes > 0
    if layout.parameter_offload:  # every optimizer state on the host was not enough: ZeRO-3's shards went too
        less = replace(layout, parameter_offload=False)
    else:  # the least share that fits, in twentieths: one step less does not
        less = replace(
            layout, optimizer_offload_fraction=round(layout.optimizer_offload_fraction - 1 / OFFLOAD_STEPS, 2)
        )
    evaluate = Evaluator(LLAMA, FINE_TUNING, NODE)
    with pytest.raises(InfeasibleConfigError):
        evaluate(less)


def test_where_a_layout_fits_without_offload_the_search_is_the_same() -> None:
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=64, seq_len=4096)
    search = ExhaustiveSearch(processes=1)
    offered = run_search(model, training, NODE, search, SearchSettings(top_k=3))
    refused = run_search(model, training, NODE, search, SearchSettings(top_k=3, optimizer_offload=False))
    assert [c.layout for c in offered.ranked] == [c.layout for c in refused.ranked]
    assert all(c.layout.optimizer_offload_fraction == 0 for c in offered.ranked)


def test_a_host_too_small_for_the_offload_gets_no_plan_and_says_so() -> None:
    small = NODE.model_copy(update={"host": HostProfile(memory_bytes=64 * 10**9, adam_params_per_s=10.2e9)})
    with pytest.raises(InfeasibleConfigError, match=r"With an offload, .* GiB of host memory per node"):
        _search(small)
    layout = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=8,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.NONE,
        recompute=Recompute.FULL,
        optimizer_offload_fraction=1.0,
    )
    with pytest.raises(InfeasibleConfigError, match=r"GiB of host memory per node for what it offloads"):
        Evaluator(LLAMA, FINE_TUNING, small)(layout)


def test_a_cluster_without_host_facts_is_not_offered_an_offload() -> None:
    bare = NODE.model_copy(update={"host": None})
    with pytest.raises(InfeasibleConfigError, match=r"optimizer offload to host memory \(a cluster that describes"):
        _search(bare)


def test_where_every_optimizer_state_on_the_host_is_not_enough_zero3_offloads_the_weights_too() -> None:
    # Llama 3 405B on 4 DGX H100 (B 64, s 4096): the fastest plan keeps its ZeRO-3 weight shards on the host
    model, nodes = load_model("llama3-405b"), load_cluster("dgx-h100:4")
    best = run_search(model, FINE_TUNING, nodes, ExhaustiveSearch(processes=1), SearchSettings(top_k=1)).ranked[0]
    assert best.layout.parameter_offload and best.layout.optimizer_offload_fraction == 1.0
    assert best.estimate.fits and best.estimate.stages[0].memory.weights_bytes < 20 * 2**30


def test_optuna_offers_the_offload_as_the_exhaustive_scan_does() -> None:
    settings = SearchSettings(top_k=1, budget=Budget(max_trials=200))
    best = run_search(LLAMA, FINE_TUNING, NODE, OptunaSearch(), settings).ranked[0]
    assert best.layout.optimizer_offload_fraction > 0 and best.estimate.fits
    exhaustive = _search(top_k=1).ranked[0]
    assert best.estimate.step_time_s >= exhaustive.estimate.step_time_s  # the scan's is the fastest


def test_a_share_the_stack_refuses_is_offered_whole() -> None:
    # DeepSpeed offloads a share below 1 under ZeRO-3 only: on 48 GB GPUs, Llama 3 8B under ZeRO-1
    # needs a share of its optimizer states offloaded, and is offered them all
    model, training = load_model("llama3-8b"), FINE_TUNING.under("deepspeed")
    small = NODE.model_copy(update={"device": NODE.device.model_copy(update={"memory_bytes": 48 * 10**9})})
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
        recompute=Recompute.FULL,
    )
    unchecked = Evaluator(model, training, small)
    checked = Evaluator(model, training, small, admit=admission(model, training, small))
    assert 0 < unchecked.least_offload(layout).optimizer_offload_fraction < 1  # what fits
    assert checked.least_offload(layout).optimizer_offload_fraction == 1.0
    # under ZeRO-3 a share is DeepSpeed's ratio: on 20 GB GPUs 60% of the states (its eager loss holds 12 bytes a logit)
    tiny = small.model_copy(update={"device": small.device.model_copy(update={"memory_bytes": 20 * 10**9})})
    zero3 = replace(layout, zero_stage=ZeroStage.PARAMETERS)
    offered = Evaluator(model, training, tiny, admit=admission(model, training, tiny)).least_offload(zero3)
    assert offered.optimizer_offload_fraction == 0.6
