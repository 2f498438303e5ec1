"""GEMM and elementwise pricing, against hand-worked values."""

import pytest
from conftest import make_cluster

from cost_models.compute import (
    Gemm,
    elementwise_time_s,
    gemm_time_s,
    measured_layer_s,
    measured_optimizer_s,
    measured_output_layer_s,
    measured_sharded_unit_s,
    quantization_efficiency,
)
from cost_models.layer_work import layer_work, profile_gemm_shapes
from planner.files.models import load_model
from planner.schemas import (
    DeviceProfile,
    DType,
    LayerRecord,
    Layout,
    MatmulRecord,
    OpKind,
    OptimizerRecord,
    ShardedUnitRecord,
    TrainingSpec,
    ZeroStage,
)

DEVICE = make_cluster().device


def test_full_waves_run_at_peak_fraction() -> None:
    device = make_cluster().device
    # 256 x 256 output = 4 tiles of 128 x 128 = one full wave over 4 units.
    g = Gemm(256, 256, 4096)
    assert quantization_efficiency(g, device) == 1.0
    assert gemm_time_s(g, device, DType.BF16) == pytest.approx(g.flop / (100e12 * 0.5))


def test_partial_wave_and_edge_tiles_cost_their_share() -> None:
    device = make_cluster().device
    # 5 tiles over 4 units: 2 waves, 5/8 useful.
    assert quantization_efficiency(Gemm(640, 128, 64), device) == pytest.approx(5 / 8)
    # 129 rows need 2 tile rows (129/256 useful); their 2 tiles fill half of one wave.
    assert quantization_efficiency(Gemm(129, 128, 64), device) == pytest.approx(129 / 256 * 2 / 4)


def test_thin_gemm_is_memory_bound() -> None:
    device = make_cluster().device
    g = Gemm(8192, 8192, 1)
    assert gemm_time_s(g, device, DType.BF16) == pytest.approx(g.io_bytes(2) / 1e12)


def test_measured_record_wins_and_scales_with_batch() -> None:
    device = make_cluster().device.model_copy(
        update={"matmul_records": (MatmulRecord(m=64, n=64, k=64, dtype=DType.BF16, time_s=1e-3),)}
    )
    assert gemm_time_s(Gemm(64, 64, 64, batch=3), device, DType.BF16) == pytest.approx(3e-3)
    assert gemm_time_s(Gemm(64, 64, 64), device, DType.FP32) != pytest.approx(1e-3)


def test_backward_shapes_have_twice_the_forward_flops() -> None:
    g = Gemm(100, 200, 300, batch=2)
    dgrad, wgrad = g.backward()
    assert (dgrad.m, dgrad.n, dgrad.k) == (100, 300, 200)
    assert (wgrad.m, wgrad.n, wgrad.k) == (300, 200, 100)
    assert dgrad.flop + wgrad.flop == 2 * g.flop


def test_elementwise_is_bytes_over_bandwidth() -> None:
    assert elementwise_time_s(3e9, make_cluster().device) == pytest.approx(3e-3)


def _layer(
    model: str, op: OpKind, tp: int, micro_batch: int, fwd_s: float, both_s: float, sp: bool | None = None
) -> LayerRecord:
    """A layer record of ``model`` in bf16 at sequence length 128."""
    return LayerRecord(
        op=op,
        model=model,
        tensor_parallel_degree=tp,
        micro_batch_size=micro_batch,
        seq_len=128,
        sequence_parallel=sp,
        dtype=DType.BF16,
        fwd_time_s=fwd_s,
        fwd_bwd_time_s=both_s,
    )


def _with_layer_records(*records: tuple[int, int, float, float]) -> DeviceProfile:
    """The test device with 'layer' records of tiny-gpt: (tp, micro-batch, fwd s, fwd+bwd s) at s=128."""
    ops = tuple(_layer("tiny-gpt", OpKind.LAYER, t, b, f, fb) for t, b, f, fb in records)
    return DEVICE.model_copy(update={"op_records": ops})


def test_a_measured_layer_is_used_as_timed_and_interpolated_in_micro_batch() -> None:
    dev = _with_layer_records((1, 1, 1.0e-3, 4.0e-3), (1, 2, 1.5e-3, 6.0e-3), (1, 8, 4.5e-3, 18.0e-3))
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 2, 128) == pytest.approx((1.5e-3, 4.5e-3))
    # b = 4 lies between 2 and 8: the line through them, 0.5 ms forward and 1.5 ms backward a sequence.
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 4, 128) == pytest.approx((2.5e-3, 7.5e-3))
    # b = 16 beyond 8: the same line, extended.
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 16, 128) == pytest.approx((8.5e-3, 25.5e-3))
    # Another model, precision, tp or sequence length has no record: the kernel model prices it.
    assert measured_layer_s(dev, "llama3-8b", DType.BF16, 1, 2, 128) is None
    assert measured_layer_s(dev, "tiny-gpt", DType.FP32, 1, 2, 128) is None
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 2, 2, 128) is None
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 2, 256) is None


def test_beyond_the_largest_size_the_slope_is_that_of_every_size() -> None:
    # Forward 1, 1.5, 3.0, 2.8 ms at 1, 2, 4, 8: the two largest give a flat line (noise). The
    # least-squares slope over all four: sum (b - 3.75)(t - 2.075) / sum (b - 3.75)^2 =
    # 7.275 / 28.75 ms a sequence; backward (3, 4.5, 9, 8.4 ms): 21.825 / 28.75.
    dev = _with_layer_records(
        (1, 1, 1.0e-3, 4.0e-3), (1, 2, 1.5e-3, 6.0e-3), (1, 4, 3.0e-3, 12.0e-3), (1, 8, 2.8e-3, 11.2e-3)
    )
    fwd, bwd = 2.8e-3 + 8 * 7.275e-3 / 28.75, 8.4e-3 + 8 * 21.825e-3 / 28.75
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 16, 128) == pytest.approx((fwd, bwd))
    # Inside the measured range, the nearest two still decide.
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 1, 6, 128) == pytest.approx((3.0e-3, 9.0e-3))


def test_one_measured_size_scales_in_proportion() -> None:
    dev = _with_layer_records((2, 4, 2.0e-3, 6.0e-3))
    assert measured_layer_s(dev, "tiny-gpt", DType.BF16, 2, 8, 128) == pytest.approx((4.0e-3, 8.0e-3))


def test_the_optimizer_is_priced_at_its_measured_rate() -> None:
    rec = OptimizerRecord(model="tiny-gpt", num_parameters=200_000, dtype=DType.FP32, time_s=1.0e-3)
    dev = DEVICE.model_copy(update={"op_records": (rec,)})
    assert measured_optimizer_s(dev, "tiny-gpt", 1_000_000) == pytest.approx(5.0e-3)
    assert measured_optimizer_s(dev, "gpt3-175b", 1_000_000) is None


def test_the_optimizer_is_priced_in_the_weights_precision_else_any() -> None:
    fp32 = OptimizerRecord(model="tiny-gpt", num_parameters=200_000, dtype=DType.FP32, time_s=1.0e-3)
    bf16 = OptimizerRecord(model="tiny-gpt", num_parameters=200_000, dtype=DType.BF16, time_s=3.0e-3)
    dev = DEVICE.model_copy(update={"op_records": (fp32, bf16)})
    assert measured_optimizer_s(dev, "tiny-gpt", 1_000_000, DType.BF16) == pytest.approx(15.0e-3)
    assert measured_optimizer_s(dev, "tiny-gpt", 1_000_000, DType.FP32) == pytest.approx(5.0e-3)
    assert measured_optimizer_s(dev, "tiny-gpt", 1_000_000, DType.FP16) == pytest.approx(5.0e-3)  # the first


def test_the_real_tensor_parallel_layer_is_a_record_of_its_own() -> None:
    local = _layer("m", OpKind.LAYER, 2, 4, 1e-3, 3e-3)
    real = [_layer("m", OpKind.TP_LAYER, 2, 4, f, fb, sp) for sp, f, fb in ((False, 4e-3, 9e-3), (True, 5e-3, 12e-3))]
    dev = DEVICE.model_copy(update={"op_records": (local, *real)})
    assert measured_layer_s(dev, "m", DType.BF16, 2, 4, 128) == pytest.approx((1e-3, 2e-3))
    assert measured_layer_s(dev, "m", DType.BF16, 2, 4, 128, sequence_parallel=False) == pytest.approx((4e-3, 5e-3))
    assert measured_layer_s(dev, "m", DType.BF16, 2, 4, 128, sequence_parallel=True) == pytest.approx((5e-3, 7e-3))


def test_the_output_layer_record_is_matched_on_its_named_fields() -> None:
    # tp 1 is timed once, unsplit: asked with sequence parallelism it is the same record.
    records = (
        _layer("m", OpKind.OUTPUT_LAYER, 1, 2, 1e-3, 3e-3, False),
        _layer("m", OpKind.OUTPUT_LAYER, 2, 2, 2e-3, 5e-3, False),
        _layer("m", OpKind.OUTPUT_LAYER, 2, 2, 4e-3, 9e-3, True),
        _layer("m", OpKind.TP_LAYER, 2, 2, 7e-3, 8e-3, True),  # another op: never an output layer
    )
    dev = DEVICE.model_copy(update={"op_records": records})
    for sp in (False, True):
        assert measured_output_layer_s(dev, "m", DType.BF16, 1, 2, 128, sequence_parallel=sp) == pytest.approx(3e-3)
    assert measured_output_layer_s(dev, "m", DType.BF16, 2, 2, 128, sequence_parallel=False) == pytest.approx(5e-3)
    assert measured_output_layer_s(dev, "m", DType.BF16, 2, 2, 128, sequence_parallel=True) == pytest.approx(9e-3)
    assert measured_output_layer_s(dev, "m", DType.BF16, 4, 2, 128, sequence_parallel=True) is None


def test_the_sharded_unit_record_is_matched_on_stage_and_deferral_in_the_plans_precision_first() -> None:
    def unit(zero: ZeroStage, deferred: bool, dtype: DType, seconds: float) -> ShardedUnitRecord:
        return ShardedUnitRecord(zero_stage=zero, deferred=deferred, dtype=dtype, time_s=seconds)

    records = (
        unit(ZeroStage.PARAMETERS, False, DType.FP32, 1e-3),
        unit(ZeroStage.PARAMETERS, False, DType.BF16, 2e-3),
        unit(ZeroStage.PARAMETERS, True, DType.FP32, 3e-3),
        unit(ZeroStage.GRADIENTS, False, DType.BF16, 4e-3),
    )
    dev = DEVICE.model_copy(update={"op_records": records})
    assert measured_sharded_unit_s(dev, ZeroStage.PARAMETERS, False, DType.BF16) == 2e-3
    assert measured_sharded_unit_s(dev, ZeroStage.PARAMETERS, True, DType.BF16) == 3e-3  # any precision serves
    assert measured_sharded_unit_s(dev, ZeroStage.GRADIENTS, False, DType.BF16) == 4e-3
    assert measured_sharded_unit_s(dev, ZeroStage.GRADIENTS, True, DType.BF16) is None


def test_profiled_gemm_shapes_are_the_layers_own_up_to_the_largest_tensor_parallel_degree() -> None:
    model = load_model("tiny-gpt")
    two = set(profile_gemm_shapes(model, 128, max_tensor_parallel=2))
    four = set(profile_gemm_shapes(model, 128, max_tensor_parallel=4))
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=4, pipeline_parallel_degree=1, micro_batch_size=1)
    tp4 = {
        (g.m, g.n, g.k) for g in layer_work(model, TrainingSpec(global_batch_size=1, seq_len=128), layout).dense_gemms
    }
    assert tp4 <= four and not tp4 <= two and two < four
