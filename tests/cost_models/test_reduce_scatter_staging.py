"""FSDP2's reduce-scatter staging (``communication_buffers.reduce_scatter_staging_bytes``, torch's
``foreach_reduce``), hand-worked on tiny-gpt: h 128, V 1024, GELU MLP of 4h with biases,
LayerNorms, tied embeddings. One layer: attention 4 h^2 + 4 h = 66,048, MLP 8 h^2 + 4 h + h
= 131,712, two norms 2 x 2 h = 512: 198,272 parameters."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.communication_buffers import reduce_scatter_staging_bytes
from cost_models.loss_memory import stage_logits_bytes
from cost_models.memory import stage_memory
from cost_models.params import stage_params
from planner.files.models import load_model
from planner.schemas import DType, Layout, TrainingSpec, ZeroStage

MODEL = load_model("tiny-gpt")
LAYER = 198_272
TRAINING = TrainingSpec(global_batch_size=4, seq_len=128)  # bf16, reduced in fp32
ZERO3 = Layout(
    data_parallel_degree=4,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.PARAMETERS,
)


def test_the_largest_unit_reduced_during_the_backward_is_a_layer_not_the_embedding() -> None:
    # Tied: the output layer is the embedding's, in the root unit, reduced last. With V = 4096
    # the embedding (V h + 256 h of positions = 557,056) is the largest unit ZeRO-3 gathers,
    # but the largest one staged while activations remain is still a layer.
    big_vocabulary = MODEL.model_copy(update={"vocab_size": 4096})
    params = stage_params(big_vocabulary, ZERO3, 0)
    assert params.largest_unit == 4096 * 128 + 256 * 128
    assert params.largest_reduced_unit == LAYER
    # Untied: the final norm with the output layer is its own unit, reduced first.
    untied = stage_params(big_vocabulary.model_copy(update={"tie_word_embeddings": False}), ZERO3, 0)
    assert untied.largest_reduced_unit == 4096 * 128 + 2 * 128


def test_zero3_stages_the_unit_in_fp32_and_its_shard() -> None:
    # The flat fp32 input, 4 bytes x 198,272, and its 1/4 shard: 991,360 bytes. The unit's bf16
    # gradients take the place of its gathered weights (freed first), counted already.
    params = stage_params(MODEL, ZERO3, 0)
    assert reduce_scatter_staging_bytes(TRAINING, ZERO3, params) == pytest.approx(LAYER * 4 * 1.25)
    bf16 = TRAINING.model_copy(update={"grad_reduce_dtype": DType.BF16})
    assert reduce_scatter_staging_bytes(bf16, ZERO3, params) == pytest.approx(LAYER * 2 * 1.25)


def test_zero2_adds_the_unit_gradients_beside_its_kept_weights() -> None:
    # ZeRO-2 keeps the gathered weights until the step's last backward: the bf16 gradients,
    # 2 x 198,272 bytes, add to the staging: 1,387,904 bytes.
    zero2 = replace(ZERO3, zero_stage=ZeroStage.GRADIENTS)
    params = stage_params(MODEL, zero2, 0)
    assert reduce_scatter_staging_bytes(TRAINING, zero2, params) == pytest.approx(LAYER * (5 + 2))


def test_no_staging_without_fsdp_or_under_a_pipeline() -> None:
    for layout in (
        replace(ZERO3, zero_stage=ZeroStage.OPTIMIZER),  # buckets instead
        replace(ZERO3, data_parallel_degree=1),  # nothing to shard
        replace(ZERO3, data_parallel_degree=2, pipeline_parallel_degree=2),  # one reduction, after the backward
    ):
        assert reduce_scatter_staging_bytes(TRAINING, layout, stage_params(MODEL, layout, 0)) == 0.0


def test_it_adds_what_it_exceeds_the_logits_by() -> None:
    # Logits of s b V = 131,072 elements: the fp32 softmax kept and the bf16 cast, 6 bytes each,
    # 786,432 bytes, freed by the loss's backward before the first unit is reduced. The staging
    # (991,360) adds 204,928 bytes; with s = 256 the logits (1,572,864) cover it.
    cluster = make_cluster(nodes=1, per_node=4)
    params = stage_params(MODEL, ZERO3, 0)
    assert stage_logits_bytes(MODEL, TRAINING, ZERO3, 0, params) == 786_432
    memory = stage_memory(MODEL, TRAINING, cluster, ZERO3, 0)
    assert memory.communication_buffers_bytes == pytest.approx(991_360 - 786_432)
    longer = TRAINING.model_copy(update={"seq_len": 256})
    assert stage_memory(MODEL, longer, cluster, ZERO3, 0).communication_buffers_bytes == 0.0
