"""Fused and eager elementwise kernels (``cost_models.kernels``, ``TrainingSpec.kernels``):
hand-counted traffic of each operation, a whole layer's by hand, and that eager never prices
faster than fused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import kernels
from cost_models.estimate import estimate
from cost_models.layer_work import layer_work, output_layer_elementwise
from cost_models.optimizer import optimizer_step_s
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import DType, Kernels, Layout, NormKind, PositionEmbedding, Recompute, TrainingSpec

FUSED, EAGER = Kernels.FUSED, Kernels.EAGER


def test_each_operation_moves_what_its_kernels_read_and_write() -> None:
    # RMSNorm eager in bf16: widen (2 + 4), square (8), mean (4), scale (8), narrow (4 + 2), weight (4).
    assert kernels.norm(NormKind.RMSNORM, 10, 2, EAGER) == kernels.Traffic(360.0, 7)
    assert kernels.norm(NormKind.RMSNORM, 10, 4, EAGER) == kernels.Traffic(280.0, 5)  # fp32: no casts
    assert kernels.norm(NormKind.RMSNORM, 10, 2, FUSED) == kernels.Traffic(40.0, 1)
    assert kernels.norm(NormKind.LAYERNORM, 10, 2, EAGER) == kernels.Traffic(40.0, 1)  # one native kernel
    assert kernels.activation(True, 10, 2, EAGER) == kernels.Traffic(100.0, 2)  # SiLU (2e), product (3e)
    assert kernels.activation(True, 10, 2, FUSED) == kernels.Traffic(60.0, 1)
    assert kernels.activation(False, 10, 2, EAGER) == kernels.Traffic(40.0, 1)
    assert kernels.rotary(8, 2, 2, EAGER) == kernels.Traffic(180.0, 14)  # 9e per element, 7 kernels a tensor
    assert kernels.residual_add(10, 2, True, EAGER) == kernels.Traffic(110.0, 2)  # dropout 2e + mask, add 3e
    assert kernels.residual_add(10, 2, True, FUSED) == kernels.Traffic(70.0, 1)
    assert kernels.cross_entropy(10, 2, EAGER) == kernels.Traffic(520.0, 10)  # 48 + 2e per logit
    assert kernels.cross_entropy(10, 2, FUSED) == kernels.Traffic(120.0, 2)
    assert kernels.attention_output(10, 2, FUSED) == kernels.NONE


def test_a_llama_layer_by_hand() -> None:
    # llama3-8b, one rank, one 4096-token sequence, bf16: T = 4096, h = 4096, q = 4096, kv = 1024, f = 14336.
    model = load_model("llama3-8b")
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    t, h, f, qk = 4096, 4096, 14336, 4096 + 1024
    fused = 2 * 2 * t * h * 2 + 2 * 3 * t * h * 2 + 3 * t * f * 2 + 2 * t * qk * 2
    eager = 2 * 36 * t * h + 2 * 3 * t * h * 2 + 5 * t * f * 2 + 9 * t * qk * 2 + 2 * t * h * 2
    for kinds, want_bytes, want_kernels in ((FUSED, fused, 2 + 2 + 1 + 2), (EAGER, eager, 14 + 2 + 2 + 14 + 1)):
        work = layer_work(model, TrainingSpec(global_batch_size=1, seq_len=4096, kernels=kinds), layout)
        assert work.elementwise_bytes == want_bytes
        assert work.elementwise_kernels == want_kernels
    assert eager / fused == pytest.approx(3.163, abs=1e-3)


def test_an_eager_loss_under_fused_kernels_moves_52_bytes_a_logit() -> None:
    # Megatron-LM without --cross-entropy-loss-fusion: fused norms, the loss one pass per op.
    # llama3-8b (RMSNorm, V = 128256), one 4096-token sequence, tp 2: 4096 x 64128 logits on a
    # rank, each 48 + 2e = 52 bytes through ten kernels where fused moves 12 in two; the final
    # norm's forward and backward (three fused passes of 2e over T h) are the same either way.
    model = load_model("llama3-8b")
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=1)
    logits, norms = 4096 * 64128, 3 * 2 * 2 * 4096 * 4096
    fused = TrainingSpec(global_batch_size=1, seq_len=4096, kernels=Kernels.FUSED)
    assert output_layer_elementwise(model, fused, layout) == kernels.Traffic(12.0 * logits + norms, 2 + 3)
    eager_loss = fused.model_copy(update={"loss_kernels": EAGER})
    assert output_layer_elementwise(model, eager_loss, layout) == kernels.Traffic(52.0 * logits + norms, 10 + 3)
    # None follows the other kernels: an eager stack runs an eager loss, and may be told a fused one.
    eager = TrainingSpec(global_batch_size=1, seq_len=4096, kernels=EAGER)
    eager_norms = 3 * (28 + 4 * 2) * 4096 * 4096  # RMSNorm eager: 28 + 4e per element, 7 kernels
    assert output_layer_elementwise(model, eager, layout) == kernels.Traffic(52.0 * logits + eager_norms, 10 + 21)
    fused_loss = eager.model_copy(update={"loss_kernels": FUSED})
    assert output_layer_elementwise(model, fused_loss, layout) == kernels.Traffic(12.0 * logits + eager_norms, 2 + 21)


def test_alibi_adds_no_rotary_traffic() -> None:
    model = load_model("llama3-8b")
    alibi = model.model_copy(update={"position_embedding_type": PositionEmbedding.ALIBI})
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    training = TrainingSpec(global_batch_size=1, seq_len=4096, kernels=EAGER)
    rope_bytes = layer_work(model, training, layout).elementwise_bytes
    assert rope_bytes - layer_work(alibi, training, layout).elementwise_bytes == 9 * 4096 * (4096 + 1024) * 2


def test_an_eager_adam_step_moves_78_bytes_a_parameter_to_the_fused_28() -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    fused, eager = (
        optimizer_step_s(model, cluster, layout, kinds, weights_dtype=DType.BF16) for kinds in (FUSED, EAGER)
    )
    assert eager / fused == pytest.approx(78 / 28, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["llama3-8b", "gpt3-175b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"]),
    tp=st.sampled_from([1, 2, 4]),
    micro_batch=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from(list(Recompute)),
)
def test_eager_kernels_never_price_a_step_faster(name: str, tp: int, micro_batch: int, recompute: Recompute) -> None:
    model, cluster = load_model(name), load_cluster("dgx-h100:2")
    layout = Layout(
        data_parallel_degree=16 // tp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=1,
        micro_batch_size=micro_batch,
        recompute=recompute,
        sequence_parallel=tp > 1,
    )
    times = [
        estimate(model, TrainingSpec(global_batch_size=64, seq_len=2048, kernels=k), cluster, layout).step_time_s
        for k in (FUSED, EAGER)
    ]
    assert times[1] > times[0]
