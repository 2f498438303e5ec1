"""Refiners run on the finalists, in the order given; the CP-SAT layer split is one of them."""

from dataclasses import dataclass, field, replace
from typing import ClassVar

from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.layer_split import LayerSplitRefiner
from planner.search_engine.refiner import Refiner
from planner.search_engine.runner import DEFAULT_REFINERS, run_search
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import Candidate

MODEL, CLUSTER = load_model("tiny-gpt"), load_cluster("dgx-a100-80g:1")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)


@dataclass
class Recording:
    """A refiner that changes nothing but hands on a new candidate object, and records what it saw."""

    name: ClassVar[str] = "recording"
    seen: list[Candidate] = field(default_factory=list)
    returned: list[Candidate] = field(default_factory=list)

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        assert isinstance(evaluate, Evaluator) and seed == 5
        self.seen.append(candidate)
        self.returned.append(Candidate(candidate.layout, candidate.estimate))
        return self.returned[-1]


def test_every_refiner_refines_every_finalist_in_order() -> None:
    first, second = Recording(), Recording()
    refiners: tuple[Refiner, ...] = (first, second)
    outcome = run_search(
        MODEL, TRAINING, CLUSTER, ExhaustiveSearch(), SearchSettings(top_k=2, seed=5), refiners=refiners
    )
    space = SearchSpace(model=MODEL, training=TRAINING, world_size=CLUSTER.world_size, devices_per_node=8)
    searched = ExhaustiveSearch().search(space, Evaluator(MODEL, TRAINING, CLUSTER), Budget(), seed=0)
    assert [c.layout for c in first.seen] == [c.layout for c in searched.feasible[:10]]  # the finalists
    # The second refiner starts from what the first returned, and the ranking from the second's output.
    assert all(a is b for a, b in zip(second.seen, first.returned, strict=True))
    assert all(any(c is r for r in second.returned) for c in outcome.ranked)


def test_without_refiners_the_split_stays_even() -> None:
    outcome = run_search(MODEL, TRAINING, CLUSTER, ExhaustiveSearch(), SearchSettings(top_k=50), refiners=())
    assert all(c.layout.layer_split is None for c in outcome.ranked)


def test_the_layer_split_refiner_is_a_default_and_splits_a_pipeline_unevenly_when_faster() -> None:
    assert any(isinstance(r, LayerSplitRefiner) for r in DEFAULT_REFINERS)
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100-80g:2")
    evaluate = Evaluator(model, TrainingSpec(global_batch_size=64, seq_len=4096), cluster)
    even = Layout(
        data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=4, micro_batch_size=1, zero_stage=1
    )
    candidate = Candidate(even, evaluate(even))
    refined = LayerSplitRefiner().refine(candidate, evaluate, Budget(), seed=0)
    assert refined.layout.layer_split is not None and sum(refined.layout.layer_split) == model.num_hidden_layers
    assert refined.estimate.step_time_s < candidate.estimate.step_time_s
    assert refined.estimate.peak_memory_bytes <= evaluate.usable_memory_bytes
    # No pipeline, nothing to split; but a full recompute the layout does not need is dropped.
    flat = Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=3,
        recompute="full",
    )
    flat_candidate = Candidate(flat, evaluate(flat))
    kept = LayerSplitRefiner().refine(flat_candidate, evaluate, Budget(), seed=0)
    assert kept.layout == replace(flat, recompute="none")
    assert kept.estimate.step_time_s < flat_candidate.estimate.step_time_s
    # Where the search may not offer it (its constraints leave full recompute out), it is kept.
    evaluate.partial_recompute = False
    assert LayerSplitRefiner().refine(flat_candidate, evaluate, Budget(), seed=0) is flat_candidate


def test_the_python_api_passes_refiners_through() -> None:
    recording = Recording()
    api.search(MODEL, CLUSTER, TRAINING, SearchSettings(top_k=2, seed=5), refiners=(recording,))
    assert len(recording.seen) == 10
