"""A tied embedding split from its output layer across the pipeline sums its two copies'
gradients every step (``vocabulary.tied_embedding_sync_s``): hand-worked on two nodes of four
(10 GB/s between nodes, 1 us a hop inside a node), and nothing where no second copy exists; and the copy the
sum makes in the reduce precision (``communication_buffers.tied_gradient_sum_bytes``)."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.communication_buffers import communication_buffer_bytes, tied_gradient_sum_bytes
from cost_models.estimate import estimate
from cost_models.memory import stage_memory
from cost_models.params import stage_params
from cost_models.vocabulary import tied_embedding_sync_s
from planner.files.models import load_model
from planner.schemas import DType, Layout, PipelineBuffers, TrainingSpec, VocabularyLayout, ZeroStage

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128, grad_reduce_dtype=DType.BF16)  # summed in bf16
CLUSTER = make_cluster(nodes=2, per_node=4)
PIPELINE = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)


def test_the_two_copies_sum_across_the_nodes() -> None:
    # stage 0 on node 0, stage 1 on node 1: each pair all-reduces V h bf16 bytes (262 kB) over one
    # inter-node link, a ring of 2 hops and 2 (n - 1)/n = 1 buffer, as NCCL's tuner prices it: in
    # LL128 (base 14 us, 8.5 us a network hop with one member a node, 0.92 of 10 GB/s).
    grad_bytes = MODEL.vocab_size * MODEL.hidden_size * 2
    want = 14e-6 + 2 * 8.5e-6 + grad_bytes / 9.2e9
    assert MODEL.tie_word_embeddings
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, PIPELINE) == pytest.approx(want, rel=1e-12)
    # Rows over t: half each, where LL wins (base 6.6 us, 5 us a hop, half of 10 GB/s).
    split = replace(PIPELINE, tensor_parallel_degree=2, data_parallel_degree=2)
    half = 6.6e-6 + 2 * 5e-6 + grad_bytes / 2 / 5e9
    assert tied_embedding_sync_s(MODEL, TRAINING, CLUSTER, split) == pytest.approx(half, rel=1e-12)


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


def test_the_sum_copies_the_rows_in_the_reduce_precision() -> None:
    # bf16 gradients summed in fp32: V h = 1024 x 128 rows' elements x 4 bytes = 524,288 bytes on
    # both copies' ranks; split over t = 2, half. FSDP's gradient shards are fp32 already: no copy
    # when summed in fp32, a 1/d bf16 one when summed in bf16. No copy in bf16 from bf16.
    fp32_sum = TrainingSpec(global_batch_size=32, seq_len=128)
    assert fp32_sum.reduce_dtype is DType.FP32
    assert [tied_gradient_sum_bytes(MODEL, fp32_sum, PIPELINE, stage) for stage in (0, 1)] == [524_288, 524_288]
    split = replace(PIPELINE, tensor_parallel_degree=2, data_parallel_degree=2)
    assert tied_gradient_sum_bytes(MODEL, fp32_sum, split, 1) == 262_144
    zero2 = replace(PIPELINE, zero_stage=ZeroStage.GRADIENTS)
    assert tied_gradient_sum_bytes(MODEL, fp32_sum, zero2, 0) == 0.0
    assert tied_gradient_sum_bytes(MODEL, TRAINING, zero2, 0) == 1024 * 128 / 4 * 2
    assert tied_gradient_sum_bytes(MODEL, TRAINING, PIPELINE, 0) == 0.0  # bf16 from bf16
    untied = MODEL.model_copy(update={"tie_word_embeddings": False})
    assert tied_gradient_sum_bytes(untied, fp32_sum, PIPELINE, 0) == 0.0


def test_the_copy_adds_what_it_exceeds_the_freed_activations_and_logits_by() -> None:
    # It is made after the backward: with 8-token sequences the stage's activations and logits
    # are below the 524,288-byte copy, which adds the difference; with 128 it adds nothing.
    # (The pipeline's receive buffers per transfer: kept per micro-batch they would sit beside the copy.)
    for seq_len in (8, 128):
        training = TrainingSpec(global_batch_size=32, seq_len=seq_len, pipeline_buffers=PipelineBuffers.PER_TRANSFER)
        for stage in (0, 1):
            memory = stage_memory(MODEL, training, CLUSTER, PIPELINE, stage)
            params = stage_params(MODEL, PIPELINE, stage)
            freed = memory.activations_bytes + memory.logits_bytes
            buckets = communication_buffer_bytes(MODEL, training, PIPELINE, params)
            assert (freed < 524_288) is (seq_len == 8)
            assert memory.communication_buffers_bytes == pytest.approx(buckets + max(0.0, 524_288 - freed))
