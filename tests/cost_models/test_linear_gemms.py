"""The linear layers' GEMM time under an FP8 recipe (cost_models.linear_gemms): FP8 GEMMs at the
preset's measured FP8 rate plus the quantization passes each library runs, hand-worked on one
GEMM; without a recipe exactly the high-precision GEMMs."""

import pytest

from cost_models import linear_gemms
from cost_models.compute import Gemm, backward_gemms_time_s, elementwise_time_s, gemm_time_s, gemms_time_s
from planner.files.cluster_presets import cluster_preset
from planner.schemas import DType, TrainingSpec
from planner.schemas.precision import Precision

H100 = cluster_preset("dgx-h100", 1).device
B200 = cluster_preset("dgx-b200", 1).device
BIG = Gemm(8192, 14336, 4096)
"""Llama 3 8B's MLP up projection over 8192 tokens: every library converts it."""


def _precision(stack: str, recipe: str | None) -> Precision:
    fp8 = {} if recipe is None else {"fp8": recipe}
    return TrainingSpec(global_batch_size=8, seq_len=8192, stack=stack, **fp8).precision


def test_without_a_recipe_the_linear_gemms_are_the_high_precision_gemms() -> None:
    gemms = (BIG, Gemm(8192, 8, 4096, linear=False))
    precision = _precision("megatron-lm", None)
    assert linear_gemms.forward_s(gemms, H100, precision, 4) == gemms_time_s(gemms, H100, DType.BF16)
    assert linear_gemms.backward_s(gemms, H100, precision) == backward_gemms_time_s(gemms, H100, DType.BF16)


def test_delayed_scaling_by_hand() -> None:
    # Transformer Engine, delayed scaling: one read of the bf16 input (2 B) and two FP8 layouts
    # written (2 x 1 B) in one kernel; the weights likewise, cast once a step over 4 micro-batches.
    m, n, k = BIG.m, BIG.n, BIG.k
    bandwidth = H100.memory_bandwidth_bytes_per_s
    launch = H100.matmul.launch_overhead_s
    inputs = m * k * 4 / bandwidth + launch
    weights = (k * n * 4 / bandwidth + launch) / 4
    expected = gemm_time_s(BIG, H100, DType.FP8) + inputs + weights
    got = linear_gemms.forward_s((BIG,), H100, _precision("megatron-lm", "delayed"), 4)
    assert got == pytest.approx(expected, rel=1e-12)
    # backward: both GEMMs in FP8, the output gradient cast in both layouts; the saved FP8 input
    # and cached weight transpose need no cast
    dgrad, wgrad = BIG.backward()
    grad_cast = m * n * 4 / bandwidth + launch
    expected_bwd = gemm_time_s(dgrad, H100, DType.FP8) + gemm_time_s(wgrad, H100, DType.FP8) + grad_cast
    got_bwd = linear_gemms.backward_s((BIG,), H100, _precision("megatron-lm", "delayed"))
    assert got_bwd == pytest.approx(expected_bwd, rel=1e-12)


def test_torchao_casts_again_in_the_backward() -> None:
    # torchao tensorwise: amax then cast (2 reads, 2 kernels) of the input and the weights every
    # micro-batch; the backward casts the output gradient (both layouts) and the weights and input again.
    m, n, k = BIG.m, BIG.n, BIG.k
    bw, launch = H100.memory_bandwidth_bytes_per_s, H100.matmul.launch_overhead_s
    precision = _precision("torchtitan", "tensorwise")
    forward = gemm_time_s(BIG, H100, DType.FP8) + elementwise_time_s(m * k * 5.0, H100, 2)
    forward += elementwise_time_s(k * n * 5.0, H100, 2)
    assert linear_gemms.forward_s((BIG,), H100, precision, 4) == pytest.approx(forward, rel=1e-12)
    dgrad, wgrad = BIG.backward()
    casts = (m * n * 6.0 + k * n * 5.0 + m * k * 5.0) / bw + 6 * launch
    backward = gemm_time_s(dgrad, H100, DType.FP8) + gemm_time_s(wgrad, H100, DType.FP8) + casts
    assert linear_gemms.backward_s((BIG,), H100, precision) == pytest.approx(backward, rel=1e-12)


def test_torchao_rowwise_rescales_its_backward_gemms_outputs() -> None:
    # torchao rowwise: its slow-accumulation backward GEMMs run unscaled, and one kernel each then
    # reads and writes their bf16 output (2 + 2 B an element) to apply the row and column scales:
    # the input gradient (m x k) and the weight gradient (k x n) on top of tensorwise-like casts.
    m, n, k = BIG.m, BIG.n, BIG.k
    bw, launch = H100.memory_bandwidth_bytes_per_s, H100.matmul.launch_overhead_s
    dgrad, wgrad = BIG.backward()
    casts = (m * n * 6.0 + k * n * 5.0 + m * k * 5.0) / bw + 6 * launch
    rescales = (m * k + k * n) * 4.0 / bw + 2 * launch
    backward = gemm_time_s(dgrad, H100, DType.FP8) + gemm_time_s(wgrad, H100, DType.FP8) + casts + rescales
    got = linear_gemms.backward_s((BIG,), H100, _precision("torchtitan", "rowwise"))
    assert got == pytest.approx(backward, rel=1e-12)
    # the forward is tensorwise's: the rescale is in the forward GEMM's epilogue
    forward = linear_gemms.forward_s((BIG,), H100, _precision("torchtitan", "tensorwise"), 4)
    assert linear_gemms.forward_s((BIG,), H100, _precision("torchtitan", "rowwise"), 4) == forward


def test_fp8_gains_on_a_large_gemm_less_than_the_peak_ratio() -> None:
    bf16 = _precision("torchtitan", None)
    for stack, recipe in (("torchtitan", "tensorwise"), ("megatron-lm", "delayed"), ("megatron-lm", "tensorwise")):
        fp8 = _precision(stack, recipe)
        speedup = (linear_gemms.forward_s((BIG,), H100, bf16) + linear_gemms.backward_s((BIG,), H100, bf16)) / (
            linear_gemms.forward_s((BIG,), H100, fp8, 8) + linear_gemms.backward_s((BIG,), H100, fp8)
        )
        # faster than bf16, slower than the measured pre-quantized GEMM ratio (1402.6 / 794.5 = 1.77)
        assert 1.2 < speedup < 1.77, (stack, recipe, speedup)


def test_the_recipes_order_as_published() -> None:
    # Transformer Engine's GEMM tutorial (H200, autocast): delayed 1.69x > current 1.58x > block 1.40x
    def total(stack: str, recipe: str) -> float:
        p = _precision(stack, recipe)
        return linear_gemms.forward_s((BIG,), H100, p, 8) + linear_gemms.backward_s((BIG,), H100, p)

    assert total("megatron-lm", "delayed") < total("megatron-lm", "tensorwise") < total("megatron-lm", "blockwise")
    # the weight gradient in bf16 costs more than in FP8
    assert total("torchtitan", "rowwise") < total("torchtitan", "rowwise-gw-hp")


def test_what_stays_in_bf16() -> None:
    precision = _precision("torchtitan", "tensorwise")
    router = Gemm(8192, 64, 4096, linear=False)
    small = Gemm(8192, 1024, 4096)  # torchao's auto filter: K <= 4096 and N <= 1024
    for gemm in (router, small):
        assert not linear_gemms.in_fp8(gemm, precision)
        assert linear_gemms.forward_s((gemm,), H100, precision) == gemm_time_s(gemm, H100, DType.BF16)


def test_blockwise_on_blackwell_runs_at_the_mxfp8_rate() -> None:
    precision = _precision("megatron-lm", "blockwise")
    mxfp8 = _precision("megatron-lm", "mxfp8")
    assert linear_gemms.forward_s((BIG,), B200, precision, 8) == pytest.approx(
        linear_gemms.forward_s((BIG,), B200, mxfp8, 8), rel=1e-12
    )


def test_routed_experts_run_in_fp8_where_the_stack_converts_them() -> None:
    experts = Gemm(4096, 2 * 2048, 4096, batch=8, grouped=True)
    assert linear_gemms.in_fp8(experts, _precision("megatron-lm", "tensorwise"))
    assert linear_gemms.in_fp8(experts, _precision("planner-runtime", "tensorwise"))  # one nn.Linear an expert
    assert not linear_gemms.in_fp8(experts, _precision("torchtitan", "tensorwise"))
    assert not linear_gemms.in_fp8(experts, _precision("nemo-automodel", "tensorwise"))


def test_sequence_parallel_gathers_the_quantized_input_where_the_library_does() -> None:
    # Transformer Engine's and torchao tensorwise's sequence-parallel all-gathers carry the FP8
    # input (1 byte) forward; the backward's collectives and torchao rowwise's stay bf16.
    from cost_models.comm import Group
    from cost_models.tensor_parallel import tensor_parallel_forward_backward_s
    from planner.schemas import Layout, ModelSpec

    cluster = cluster_preset("dgx-h100", 1)
    layout = Layout(
        data_parallel_degree=1, tensor_parallel_degree=8, pipeline_parallel_degree=1, micro_batch_size=1,
        sequence_parallel=True,
    )  # fmt: skip
    model = ModelSpec.model_validate({"name": "m", "hidden_size": 8192, "num_hidden_layers": 2,
                                      "num_attention_heads": 64, "vocab_size": 32000})  # fmt: skip

    def passes(stack: str, recipe: str | None) -> tuple[float, float]:
        fp8 = {} if recipe is None else {"fp8": recipe}
        training = TrainingSpec(global_batch_size=8, seq_len=8192, stack=stack, **fp8)
        return tensor_parallel_forward_backward_s(model, training, cluster, layout, [Group(range(8))], None)

    bf16_fwd, bf16_bwd = passes("megatron-lm", None)
    assert bf16_fwd == bf16_bwd
    te_fwd, te_bwd = passes("megatron-lm", "delayed")
    assert te_fwd < bf16_fwd and te_bwd == bf16_bwd
    assert passes("torchtitan", "tensorwise")[0] == te_fwd
    assert passes("torchtitan", "rowwise") == (bf16_fwd, bf16_bwd)


def test_the_first_and_last_layers_kept_in_bf16_run_at_the_bf16_rate() -> None:
    # llama3-8b over 8 pipeline stages: 4 layers a stage. Keeping 4 at each end in bf16 makes the
    # first and last stages' layers bf16 ones and leaves the middle stages' in FP8.
    from cost_models.estimate import estimate
    from planner.files.models import load_model
    from planner.schemas import Layout

    model, cluster = load_model("llama3-8b"), cluster_preset("dgx-h100", 4)
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=8, micro_batch_size=1)

    def stages(**fp8: object) -> list[float]:
        training = TrainingSpec(global_batch_size=64, seq_len=8192, stack="megatron-lm", **fp8)
        return [s.compute_per_micro_batch_s for s in estimate(model, training, cluster, layout).stages]

    bf16, fp8, edges = stages(), stages(fp8="tensorwise"), stages(fp8="tensorwise", fp8_bf16_layers=4)
    assert edges[0] == pytest.approx(bf16[0]) and edges[-1] == pytest.approx(bf16[-1])
    assert edges[1:-1] == pytest.approx(fp8[1:-1]) and fp8[1] < bf16[1]
    one = stages(fp8="tensorwise", fp8_bf16_layers=1)
    assert fp8[0] < one[0] < bf16[0]
