"""A tied embedding split from its output layer across the pipeline sums its two copies'
gradients every step (``vocabulary.tied_embedding_sync_s``): hand-worked on two nodes of four
(10 GB/s between nodes, 1 us a hop), and nothing where no second copy exists."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.estimate import estimate
from cost_models.vocabulary import tied_embedding_sync_s
from planner.inputs import load_model
from planner.schemas import DType, Layout, TrainingSpec, VocabularyLayout

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128, grad_reduce_dtype=DType.BF16)  # summed in bf16
CLUSTER = make_cluster(nodes=2, per_node=4)
PIPELINE = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)


def test_the_two_copies_sum_across_the_nodes() -> None:
    # stage 0 on node 0, stage 1 on node 1: each pair all-reduces V h bf16 bytes over one
    # inter-node link, 2 hops and 2 (n - 1)/n = 1 buffer.
    grad_bytes = MODEL.vocab_size * MODEL.hidden_size * 2
    want = 2e-6 + grad_bytes / 10e9
    assert MODEL.tie_word_embeddings
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, PIPELINE) == pytest.approx(want, rel=1e-12)
    split = replace(PIPELINE, tensor_parallel_degree=2, data_parallel_degree=2)  # rows over t: half each
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, split) == pytest.approx(2e-6 + grad_bytes / 2 / 10e9)


def test_no_second_copy_no_sum() -> None:
    untied = MODEL.model_copy(update={"tie_word_embeddings": False})
    one_stage = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    over_pipeline = replace(PIPELINE, vocabulary_layout=VocabularyLayout.VOCAB_2)
    assert tied_embedding_sync_s(untied, TRAINING, CLUSTER, PIPELINE) == 0.0
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, one_stage) == 0.0
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, over_pipeline) == 0.0


def test_the_step_waits_for_it() -> None:
    untied = MODEL.model_copy(update={"tie_word_embeddings": False})
    tied, free = (estimate(m, TRAINING, CLUSTER, PIPELINE).time.pipeline_comm_s for m in (MODEL, untied))
    assert tied - free == pytest.approx(tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, PIPELINE), rel=1e-9)
