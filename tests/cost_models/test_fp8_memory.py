"""What an FP8 recipe changes in a rank's memory, hand-worked: Transformer Engine's FP8 weight
copies (and FP8 parameters in place of bf16 ones) and its linear inputs saved in FP8; torchao,
which keeps neither, changes nothing but what ZeRO-3 gathers."""

import pytest

from cost_models.activations import layer_activations
from cost_models.fp8_weights import fp8_weight_bytes
from cost_models.memory import stage_memory
from planner.files.cluster_presets import cluster_preset
from planner.files.models import load_model
from planner.schemas import DType, Layout, TrainingSpec, ZeroStage

LLAMA = load_model("llama3-8b")
H100 = cluster_preset("dgx-h100", 1)
B200 = cluster_preset("dgx-b200", 1)


def _training(stack: str, **fp8: object) -> TrainingSpec:
    return TrainingSpec(global_batch_size=16, seq_len=8192, stack=stack, **fp8)


def _layout(zero: ZeroStage = ZeroStage.OPTIMIZER) -> Layout:
    return Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=zero,
    )


def _linear_params_per_layer() -> int:
    h, f = LLAMA.hidden_size, LLAMA.ffn_size
    q, kv = LLAMA.num_attention_heads * LLAMA.head_size, LLAMA.kv_heads * LLAMA.head_size
    return h * (q + 2 * kv) + q * h + h * 2 * f + f * h  # fused QKV, output, gate + up, down


def test_transformer_engine_keeps_an_fp8_copy_and_its_transpose_on_hopper() -> None:
    layers = LLAMA.num_hidden_layers
    got = fp8_weight_bytes(LLAMA, _training("megatron-lm", fp8="delayed"), _layout(), H100.device, layers, 0)
    assert got == 2 * _linear_params_per_layer() * layers
    # on Blackwell one layout serves both GEMMs: 1 byte; MXFP8's two block layouts, 2 bytes and their scales
    got = fp8_weight_bytes(LLAMA, _training("megatron-lm", fp8="tensorwise"), _layout(), B200.device, layers, 0)
    assert got == _linear_params_per_layer() * layers
    got = fp8_weight_bytes(LLAMA, _training("megatron-lm", fp8="mxfp8"), _layout(), B200.device, layers, 0)
    assert got == pytest.approx(2 * (1 + 1 / 32) * _linear_params_per_layer() * layers)


def test_fp8_parameters_replace_the_bf16_copy() -> None:
    layers = LLAMA.num_hidden_layers
    training = _training("megatron-lm", fp8="delayed", fp8_param_gather=True)
    assert fp8_weight_bytes(LLAMA, training, _layout(), H100.device, layers, 0) == 0.0  # 2 B of FP8 for 2 of bf16
    assert fp8_weight_bytes(LLAMA, training, _layout(), B200.device, layers, 0) == -_linear_params_per_layer() * layers


@pytest.mark.parametrize(
    ("stack", "recipe", "zero"),
    [("torchtitan", "tensorwise", ZeroStage.OPTIMIZER), ("megatron-lm", "delayed", ZeroStage.PARAMETERS)],
)
def test_no_copy_from_torchao_or_under_zero_3(stack: str, recipe: str, zero: ZeroStage) -> None:
    assert fp8_weight_bytes(LLAMA, _training(stack, fp8=recipe), _layout(zero), H100.device, 32, 0) == 0.0


def test_transformer_engine_saves_linear_inputs_in_fp8() -> None:
    kwargs = {"seq_len": 4096, "micro_batch_size": 1, "activation_dtype": DType.BF16, "tensor_parallel_degree": 2}
    bf16 = layer_activations(LLAMA, **kwargs).total_bytes  # type: ignore[arg-type]
    fp8 = layer_activations(LLAMA, **kwargs, fp8_inputs=True).total_bytes  # type: ignore[arg-type]
    tokens, h, t = 4096, LLAMA.hidden_size, 2
    q, f = LLAMA.num_attention_heads * LLAMA.head_size, LLAMA.ffn_size
    # QKV and MLP inputs (h each, whole without sequence parallelism) and the down projection's
    # input (f / t) lose a byte an element; the output projection's input gains its FP8 copy
    assert bf16 - fp8 == tokens * (h + h + f / t) - tokens * q / t


def test_the_estimate_counts_both_and_torchao_changes_nothing() -> None:
    layout = _layout()
    bf16 = stage_memory(LLAMA, _training("megatron-lm"), H100, layout, 0)
    te = stage_memory(LLAMA, _training("megatron-lm", fp8="delayed"), H100, layout, 0)
    layers = LLAMA.num_hidden_layers
    assert te.weights_bytes - bf16.weights_bytes == 2 * _linear_params_per_layer() * layers
    assert te.activations_bytes < bf16.activations_bytes
    torchao = stage_memory(LLAMA, _training("torchtitan", fp8="rowwise"), H100, layout, 0)
    assert torchao == stage_memory(LLAMA, _training("torchtitan"), H100, layout, 0)
