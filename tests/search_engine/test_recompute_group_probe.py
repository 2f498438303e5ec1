"""In an MoE model's space a recompute group holds more than the three modes (the MoE recompute
modules, ``SearchSpace.module_sets``); the exhaustive search tries its last layout (full
recompute, the least memory) once its first does not fit, and skips those between when that one
does not fit either. This changes nothing the search returns. The sets it tries by default are
ones the runtime checkpoints."""

from dataclasses import replace

import pytest

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, Recompute, TrainingSpec
from planner.schemas.runtime_support import check_recompute_modules
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch
from planner.search_engine import exhaustive as ex
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace

MIXTRAL = load_model("mixtral-8x7b")
LAYOUT = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)


@pytest.mark.parametrize(
    ("cluster", "batch", "seq_len"),
    [("dgx-h100:2", 8, 2048), ("dgx-h100:1", 64, 1024)],
    ids=["fits", "infeasible"],
)
def test_probing_full_recompute_first_changes_nothing_returned(
    cluster: str, batch: int, seq_len: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = load_cluster(cluster)
    training = TrainingSpec(global_batch_size=batch, seq_len=seq_len)
    space = SearchSpace(
        model=MIXTRAL, training=training, world_size=profile.world_size, devices_per_node=profile.devices_per_node
    )
    assert max(len(group) for group in space.groups()) == 4  # none, two selective sets, full
    probed_evaluator = Evaluator(MIXTRAL, training, profile)
    probed = ExhaustiveSearch().search(space, probed_evaluator, Budget(), seed=0)
    monkeypatch.setattr(ex, "LONG_GROUP", 99)  # every group in order, as for a dense model
    in_order_evaluator = Evaluator(MIXTRAL, training, profile)
    in_order = ExhaustiveSearch().search(space, in_order_evaluator, Budget(), seed=0)
    assert [(c.layout, c.estimate) for c in probed.feasible] == [(c.layout, c.estimate) for c in in_order.feasible]
    assert probed_evaluator.closest_miss == in_order_evaluator.closest_miss
    assert probed.evaluated < in_order.evaluated  # the probe saved work


def test_the_default_module_sets_are_ones_the_runtime_runs() -> None:
    # The output-discarding modules (layernorm, moe_act) are priced when asked for
    # (--recompute-modules), not chosen by default: the runtime refuses them, and so does its dry run.
    for name in ("mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "tiny-moe"):
        model = load_model(name)
        space = SearchSpace(
            model=model, training=TrainingSpec(global_batch_size=64, seq_len=1024), world_size=64, devices_per_node=8
        )
        for modules in space.module_sets():
            layout = replace(LAYOUT, recompute=Recompute.SELECTIVE, recompute_modules=modules)
            check_recompute_modules(layout)
        assert len(space.module_sets()) == 2
