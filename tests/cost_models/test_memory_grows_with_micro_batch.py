"""Every stage's memory is non-decreasing in the micro-batch size, everything else equal, among
layouts whose gradients add to the activations (``memory.gradients_replace_activations`` False):
the search prunes larger micro-batches of a layout found too big on it (``Evaluator.cannot_fit``)."""

from collections import defaultdict
from dataclasses import replace

import pytest

from cost_models.memory import gradients_replace_activations, stage_memory
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec
from planner.search_engine.space import SearchSpace


@pytest.mark.parametrize(
    ("model", "cluster", "batch", "seq_len"),
    [
        ("mixtral-8x7b", "dgx-h100:2", 64, 2048),
        ("llama3-8b", "dgx-h100:1", 64, 4096),
        ("deepseek-v3", "dgx-h100:4", 128, 4096),
    ],
)
def test_stage_memory_grows_with_the_micro_batch(model: str, cluster: str, batch: int, seq_len: int) -> None:
    spec, profile = load_model(model), load_cluster(cluster)
    training = TrainingSpec(global_batch_size=batch, seq_len=seq_len)
    space = SearchSpace(
        model=spec, training=training, world_size=profile.world_size, devices_per_node=profile.devices_per_node
    )
    by_rest: dict[Layout, list[Layout]] = defaultdict(list)
    for layout in space.candidates():
        if gradients_replace_activations(training, layout):
            continue  # a larger micro-batch frees more activations for the gradients: priced, not pruned
        by_rest[replace(layout, micro_batch_size=1)].append(layout)
    compared = 0
    for i, layouts in enumerate(by_rest.values()):
        if i % 2 or len(layouts) < 2:
            continue  # half the space keeps the test fast and still covers every axis
        layouts.sort(key=lambda layout: layout.micro_batch_size)
        for stage in range(layouts[0].pipeline_parallel_degree):
            peaks = [stage_memory(spec, training, profile, layout, stage).total_bytes for layout in layouts]
            assert peaks == sorted(peaks), (layouts[0].describe(), stage, peaks)
            compared += len(layouts) - 1
    assert compared > 50
