"""Memory terms counted as the runtime holds them (measured by dry runs of llama3-8b and
llama3-70b on H100 plans), hand-worked on small numbers."""

import pytest

from cost_models.communication_buffers import communication_buffer_bytes
from cost_models.loss_memory import loss_element_bytes
from cost_models.params import stage_params
from cost_models.sharding import ModelStates, fsdp_model_states, model_state_bytes
from planner.files.models import load_model
from planner.schemas import DType, Layout, LossMethod, TrainingSpec, ZeroStage, precision_of


def _layout(p: int = 1, zero: ZeroStage = ZeroStage.NONE, d: int = 1) -> Layout:
    return Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        zero_stage=zero,
    )


def test_fsdp_keeps_fp32_gradient_shards_and_no_bf16_weight_shard() -> None:
    # 1000 parameters over d = 4 in bf16: ZeRO-2 keeps the 2-byte weights whole, 4-byte gradient
    # shards (not 2) and 12 bytes of optimizer states over 4; ZeRO-3 keeps no 2-byte weight shard
    # beside the fp32 master. In fp32 the shard is the weights (no master).
    def fsdp(zero: ZeroStage, dtype: DType) -> ModelStates:
        precision = precision_of(dtype)
        return fsdp_model_states(model_state_bytes(1000, 4, zero, precision), 1000, 4, zero, precision)

    zero2 = fsdp(ZeroStage.GRADIENTS, DType.BF16)
    assert (zero2.weights_bytes, zero2.gradients_bytes, zero2.optimizer_states_bytes) == (2000, 1000, 3000)
    zero3 = fsdp(ZeroStage.PARAMETERS, DType.BF16)
    assert (zero3.weights_bytes, zero3.gradients_bytes, zero3.optimizer_states_bytes) == (0, 1000, 3000)
    fp32 = fsdp(ZeroStage.PARAMETERS, DType.FP32)
    assert (fp32.weights_bytes, fp32.gradients_bytes, fp32.optimizer_states_bytes) == (1000, 1000, 2000)


@pytest.mark.parametrize(
    ("dtype", "p", "expected"),
    [(DType.BF16, 1, (4, 2)), (DType.BF16, 2, (6, 2)), (DType.FP32, 1, (4, 4)), (DType.FP32, 2, (8, 0))],
)
def test_the_loss_keeps_its_softmax_and_under_a_pipeline_the_logits(
    dtype: DType, p: int, expected: tuple[int, int]
) -> None:
    assert loss_element_bytes(dtype, _layout(p), LossMethod.FP32_IN_PLACE) == expected


def test_fsdp_ranks_hold_no_gradient_bucket() -> None:
    model = load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=16, seq_len=128)
    for zero, buckets in ((ZeroStage.OPTIMIZER, True), (ZeroStage.GRADIENTS, False), (ZeroStage.PARAMETERS, False)):
        layout = _layout(zero=zero, d=4)
        params = stage_params(model, layout, 0)
        expected = 4 * min(50e6, params.dense) if buckets else 0.0
        assert communication_buffer_bytes(model, training, layout, params) == expected
