"""Where nothing fits without offload, the search also tries each layout without recompute or a
pipeline with the fewest of its first layers' activations on the host that fits
(``Evaluator.least_activation_offload``), and keeps it where it is faster than the optimizer's
offload. On a hand-built node whose host links are fast (400 GB/s, as NVLink-C2C's) and whose
CPU Adam is slow, Llama 3 8B at 16,384 tokens without recompute fits only with activations
offloaded."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from planner.files.models import load_model
from planner.schemas import HostProfile, Recompute, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.exhaustive import ExhaustiveSearch
from planner.search_engine.optuna_search import OptunaSearch
from planner.search_engine.runner import SearchOutcome, run_search

LLAMA = load_model("llama3-8b")
TRAINING = TrainingSpec(global_batch_size=8, seq_len=16384)
ONE_STAGE = {"tp": [1], "cp": [1], "pp": [1], "recompute": ["none"]}


def _node() -> object:
    node = make_cluster(memory_bytes=40 * 2**30)
    device = node.device.model_copy(update={"host_to_device_bytes_per_s": 400e9, "device_to_host_bytes_per_s": 400e9})
    return node.model_copy(
        update={"device": device, "host": HostProfile(memory_bytes=2 * 10**12, adam_params_per_s=1e9)}
    )


def _search(search: object = None, **settings: object) -> SearchOutcome:
    return run_search(
        LLAMA,
        TRAINING,
        _node(),  # type: ignore[arg-type]
        search or ExhaustiveSearch(processes=1),  # type: ignore[arg-type]
        SearchSettings(constraints=ONE_STAGE, **settings),  # type: ignore[arg-type]
    )


def test_the_least_activation_offload_that_fits_is_found_where_nothing_else_fits() -> None:
    best = _search(top_k=1).ranked[0]
    layout, est = best.layout, best.estimate
    assert layout.recompute is Recompute.NONE and layout.optimizer_offload_fraction == 0
    assert 0 < layout.activation_offload_layers < LLAMA.num_hidden_layers and est.fits and est.fits_host
    assert est.time.activation_offload_s > 0 and est.host_memory_per_node_bytes > 0
    evaluate = Evaluator(LLAMA, TRAINING, _node())  # type: ignore[arg-type]
    evaluate(layout)
    with pytest.raises(InfeasibleConfigError):  # one layer fewer does not fit
        evaluate(replace(layout, activation_offload_layers=layout.activation_offload_layers - 1))
    # Without it, what is left says so: the closest layout keeps its activations on the device.
    with pytest.raises(InfeasibleConfigError, match="no layout of 'llama3-8b' fits") as refused:
        _search(activation_offload=False)
    assert "most of it activations" in str(refused.value)
    assert "activation offload to host memory (a cluster that describes its hosts, and --activation-offload)" in str(
        refused.value
    )


def test_optuna_offers_it_as_the_exhaustive_scan_does() -> None:
    exhaustive = _search(top_k=1).ranked[0]
    optuna = _search(OptunaSearch(), top_k=1, budget=Budget(max_trials=60)).ranked[0]
    assert optuna.layout.activation_offload_layers > 0 and optuna.estimate.fits
    assert optuna.estimate.step_time_s >= exhaustive.estimate.step_time_s  # the scan's is the fastest


def test_a_layout_that_cannot_take_it_is_not_offered_it() -> None:
    evaluate = Evaluator(LLAMA, TRAINING, _node())  # type: ignore[arg-type]
    best = _search(top_k=1).ranked[0].layout
    kept = replace(best, activation_offload_layers=0)
    assert evaluate.least_activation_offload(kept) == best
    assert evaluate.least_activation_offload(replace(kept, recompute=Recompute.FULL)) is None  # it fits, and recomputes
    short = TrainingSpec(global_batch_size=8, seq_len=1024)
    assert Evaluator(LLAMA, short, _node()).least_activation_offload(kept) is None  # type: ignore[arg-type]
