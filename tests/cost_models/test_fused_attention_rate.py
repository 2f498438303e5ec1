"""The fused attention core priced at its own recorded rates (compute.fused_attention_s), the
presets' published FlashAttention-2 and cuDNN figures, and the layer time that reads them."""

from importlib import resources
from typing import Any

import pytest
import yaml

from cost_models import layer_work as lw
from cost_models.compute import fused_attention_s, gemms_time_s
from cost_models.layer_time import _layer_time
from planner.files import cluster_presets
from planner.files.cluster_presets import cluster_preset
from planner.files.models import load_model
from planner.schemas import AttentionKernel, AttentionRecord, DeviceProfile, DType, Layout, TrainingSpec
from planner.schemas.errors import SchemaError

FLOP_2_28 = 2.0 * 1024**2 * 128  # causal forward FLOPs of one 1024-token head of size 128 (2 s^2 d)


def _record(
    seq_len: int,
    head_size: int,
    fwd_flop_per_s: float,
    bwd_flop_per_s: float,
    kernel: AttentionKernel = AttentionKernel.FLASH,
    *,
    causal: bool = True,
) -> AttentionRecord:
    """One head, one sequence, timed at the given rates (the backward is 2.5 forwards' FLOPs;
    4 d per visible query-key pair: half of them under the causal mask)."""
    flop = (2.0 if causal else 4.0) * seq_len**2 * head_size
    fwd_s = flop / fwd_flop_per_s
    return AttentionRecord(
        batch_size=1,
        num_attention_heads=1,
        seq_len=seq_len,
        head_size=head_size,
        dtype=DType.BF16,
        kernel=kernel,
        causal=causal,
        fwd_time_s=fwd_s,
        fwd_bwd_time_s=fwd_s + 2.5 * flop / bwd_flop_per_s,
    )


def _device(*records: AttentionRecord) -> DeviceProfile:
    return cluster_preset("dgx-h100", 1).device.model_copy(update={"op_records": records})


def test_rates_are_interpolated_in_log_sequence_length_and_held_beyond_the_ends() -> None:
    device = _device(_record(1024, 128, 100e12, 50e12), _record(4096, 128, 300e12, 150e12))
    # 2048 is halfway between 1024 and 4096 in log2: 200 and 100 TFLOP/s.
    assert fused_attention_s(1e12, 2048, 128, device, DType.BF16) == pytest.approx((1e12 / 200e12, 2.5e12 / 100e12))
    assert fused_attention_s(1e12, 65536, 128, device, DType.BF16) == pytest.approx((1e12 / 300e12, 2.5e12 / 150e12))
    assert fused_attention_s(1e12, 128, 128, device, DType.BF16) == pytest.approx((1e12 / 100e12, 2.5e12 / 50e12))


def test_the_nearest_recorded_head_size_is_read() -> None:
    device = _device(_record(1024, 64, 100e12, 50e12), _record(1024, 128, 400e12, 200e12))
    # 192 is 1.5x of 128 and 3x of 64.
    assert fused_attention_s(FLOP_2_28, 1024, 192, device, DType.BF16) == pytest.approx(
        (FLOP_2_28 / 400e12, 2.5 * FLOP_2_28 / 200e12)
    )
    assert fused_attention_s(FLOP_2_28, 1024, 80, device, DType.BF16) == pytest.approx(
        (FLOP_2_28 / 100e12, 2.5 * FLOP_2_28 / 50e12)
    )


def test_no_record_in_the_dtype_means_no_rate() -> None:
    assert fused_attention_s(1e12, 2048, 128, _device(), DType.BF16) is None
    assert fused_attention_s(1e12, 2048, 128, _device(_record(1024, 128, 1e14, 1e14)), DType.FP32) is None


def test_each_kernel_reads_its_own_records_and_one_without_any_reads_the_others() -> None:
    flash, cudnn = AttentionKernel.FLASH, AttentionKernel.CUDNN
    both = _device(_record(2048, 128, 300e12, 200e12, flash), _record(2048, 128, 500e12, 400e12, cudnn))
    assert fused_attention_s(1e12, 2048, 128, both, DType.BF16, flash) == pytest.approx(
        (1e12 / 300e12, 2.5e12 / 200e12)
    )
    assert fused_attention_s(1e12, 2048, 128, both, DType.BF16, cudnn) == pytest.approx(
        (1e12 / 500e12, 2.5e12 / 400e12)
    )
    # A measured profile times one kernel (its SDPA): the other is priced at that one's rates.
    only_flash = _device(_record(2048, 128, 300e12, 200e12, flash))
    assert fused_attention_s(1e12, 2048, 128, only_flash, DType.BF16, cudnn) == pytest.approx(
        (1e12 / 300e12, 2.5e12 / 200e12)
    )


def test_h100_preset_holds_cudnn_attention_from_cudnn_frontends_h200_benchmark() -> None:
    device = cluster_preset("dgx-h100", 1).device
    fwd_s, bwd_s = fused_attention_s(1e12, 16384, 128, device, DType.BF16, AttentionKernel.CUDNN) or (0.0, 0.0)
    # cudnn-frontend's cuDNN 9.19 benchmark on an H200 (the H100's GH100 compute) at s = 16384,
    # head dim 128: causal (top_left) forward 673, forward 702 and backward 612 TFLOP/s without
    # mask; x 0.848 sustained.
    assert 1e12 / fwd_s == pytest.approx(673e12 * 0.848)
    assert 2.5e12 / bwd_s == pytest.approx(612e12 * 673 / 702 * 0.848)
    # 2.0 x FlashAttention-2's causal forward at that length (335 TFLOP/s, the FA3 paper).
    flash_fwd_s, _ = fused_attention_s(1e12, 16384, 128, device, DType.BF16) or (0.0, 0.0)
    assert flash_fwd_s / fwd_s == pytest.approx(673 / 335)
    # and the H200 preset holds the same rates: the same tensor cores, the same benchmark
    h200 = cluster_preset("dgx-h200", 1).device
    assert fused_attention_s(1e12, 16384, 128, h200, DType.BF16, AttentionKernel.CUDNN) == pytest.approx((fwd_s, bwd_s))


def test_gb200_preset_holds_cudnn_frontends_causal_rates_of_both_kernels() -> None:
    device = cluster_preset("gb200-nvl72", 1).device
    cudnn = fused_attention_s(1e12, 4096, 128, device, DType.BF16, AttentionKernel.CUDNN) or (0.0, 0.0)
    flash = fused_attention_s(1e12, 4096, 128, device, DType.BF16, AttentionKernel.FLASH) or (0.0, 0.0)
    # cudnn-frontend's GB200 CSV at 4,096 tokens: cudnn_fe 1,386 forward and 1,054 backward
    # TFLOP/s, pyt_flash_attention 387 and 311, causal as counted; x 0.815 sustained.
    assert (1e12 / cudnn[0], 2.5e12 / cudnn[1]) == pytest.approx((1386e12 * 0.815, 1054e12 * 0.815))
    assert (1e12 / flash[0], 2.5e12 / flash[1]) == pytest.approx((387e12 * 0.815, 311e12 * 0.815))


def test_a_preset_attention_block_runs_as_a_fused_kernel() -> None:
    raw = _h100_raw()
    raw["device"]["attention"][1]["runs_as"] = "eager"
    with pytest.raises(SchemaError, match=r"device.attention\[1\]: runs_as='eager' must name a fused kernel"):
        cluster_presets._build_cluster(raw, name="dgx-h100", num_nodes=1)


def test_h100_preset_holds_flash_attention_2_sustained_as_its_matmul() -> None:
    device = cluster_preset("dgx-h100", 1).device
    fwd_s, bwd_s = fused_attention_s(1e12, 4096, 128, device, DType.BF16) or (0.0, 0.0)
    # FA3 paper, FlashAttention-2 at s = 4096, head dim 128: causal forward 319, forward 368 and
    # backward 310 TFLOP/s without mask; x 0.848 sustained; causal backward 310 x 319 / 368.
    assert 1e12 / fwd_s == pytest.approx(319e12 * 0.848)
    assert 2.5e12 / bwd_s == pytest.approx(310e12 * 319 / 368 * 0.848)


def test_a100_preset_holds_flash_attention_2_forward_and_backward_together() -> None:
    device = cluster_preset("dgx-a100-80g", 1).device
    fwd_s, bwd_s = fused_attention_s(1e12, 2048, 128, device, DType.BF16) or (0.0, 0.0)
    # FA2 paper Fig. 4(d), s = 2048, causal, head dim 128: 155 TFLOP/s forward + backward, both
    # passes at that rate, x 0.848 sustained.
    assert 1e12 / fwd_s == pytest.approx(155e12 * 0.848)
    assert 2.5e12 / bwd_s == pytest.approx(155e12 * 0.848)


def test_the_layer_prices_its_attention_core_at_the_recorded_rate_else_as_gemms() -> None:
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=8, seq_len=8192)
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    with_records = cluster_preset("dgx-h100", 1)
    without = with_records.model_copy(update={"device": _device()})
    work = lw.layer_work(model, training, layout)
    causal_flop = 0.5 * sum(g.flop for g in work.attention_gemms)
    fused = fused_attention_s(causal_flop, 8192, 128, with_records.device, DType.BF16)
    assert fused is not None
    old_fwd = 0.5 * gemms_time_s(work.attention_gemms, without.device, DType.BF16)
    a = _layer_time(model, training, with_records, layout, None, moe=False)
    b = _layer_time(model, training, without, layout, None, moe=False)
    assert a.forward_s - b.forward_s == pytest.approx(fused[0] - old_fwd)
    assert a.backward_s - b.backward_s == pytest.approx(fused[1] - 2.5 * old_fwd)


def _h100_raw() -> dict[str, Any]:
    text = (resources.files("planner") / "presets" / "clusters" / "dgx-h100.yaml").read_text()
    raw: dict[str, Any] = yaml.safe_load(text)
    return raw


def test_a_preset_attention_block_names_its_source_and_holds_whole_points() -> None:
    raw = _h100_raw()
    del raw["device"]["attention"][0]["source"], raw["device"]["attention"][0]["assumption"]
    with pytest.raises(SchemaError, match=r"device.attention\[0\] names no source"):
        cluster_presets._build_cluster(raw, name="dgx-h100", num_nodes=1)
    raw = _h100_raw()
    raw["device"]["attention"][0]["points"][0] = [512, 191.0e12, 309.0e12]
    with pytest.raises(
        SchemaError, match=r"\[512, 191000000000000.0, 309000000000000.0\] is not \[seq_len in 1..16384, 3 FLOP/s"
    ):
        cluster_presets._build_cluster(raw, name="dgx-h100", num_nodes=1)
    raw = _h100_raw()
    raw["device"]["attention"][0]["forward_backward_points"] = [[512, 163.0e12]]
    with pytest.raises(SchemaError, match="needs exactly one of points, forward_backward_points"):
        cluster_presets._build_cluster(raw, name="dgx-h100", num_nodes=1)
    raw = _h100_raw()
    raw["device"]["attention"][0]["head_dim"] = 96
    with pytest.raises(SchemaError, match="head_dim=96 must be a whole number dividing 2048"):
        cluster_presets._build_cluster(raw, name="dgx-h100", num_nodes=1)


def test_unmasked_attention_reads_the_unmasked_records_else_the_causal_ones() -> None:
    causal, unmasked = _record(2048, 128, 200e12, 100e12), _record(2048, 128, 300e12, 250e12, causal=False)
    both = _device(causal, unmasked)
    assert fused_attention_s(1e12, 2048, 128, both, DType.BF16) == pytest.approx((1e12 / 200e12, 2.5e12 / 100e12))
    assert fused_attention_s(1e12, 2048, 128, both, DType.BF16, causal=False) == pytest.approx(
        (1e12 / 300e12, 2.5e12 / 250e12)
    )
    # a profile without unmasked records (schema version 8, a causal-only source) prices it causal
    assert fused_attention_s(1e12, 2048, 128, _device(causal), DType.BF16, causal=False) == pytest.approx(
        (1e12 / 200e12, 2.5e12 / 100e12)
    )


def test_h100_preset_holds_the_unmasked_rates_its_sources_measured() -> None:
    device = cluster_preset("dgx-h100", 1).device
    for kernel, forward, backward in ((AttentionKernel.FLASH, 370e12, 322e12), (AttentionKernel.CUDNN, 702e12, 612e12)):
        # forward and backward without mask at s = 16384, head dim 128 (the FA3 paper's Fig. 5(c)
        # and 6(b) for FlashAttention-2; cudnn-frontend's no_mask row for cuDNN); x 0.848 sustained
        fwd_s, bwd_s = fused_attention_s(1e12, 16384, 128, device, DType.BF16, kernel, causal=False) or (0.0, 0.0)
        assert (1e12 / fwd_s, 2.5e12 / bwd_s) == pytest.approx((forward * 0.848, backward * 0.848))
    # a causal-only source (cudnn-frontend's causal figures on B200): unmasked at the causal rates
    b200 = cluster_preset("dgx-b200", 1).device
    assert fused_attention_s(1e12, 4096, 128, b200, DType.BF16, AttentionKernel.CUDNN, causal=False) == pytest.approx(
        fused_attention_s(1e12, 4096, 128, b200, DType.BF16, AttentionKernel.CUDNN)
    )
