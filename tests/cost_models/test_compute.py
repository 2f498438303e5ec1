"""GEMM and elementwise pricing, against hand-worked values."""

import pytest
from conftest import make_cluster

from cost_models.compute import Gemm, elementwise_time_s, gemm_time_s, quantization_efficiency
from planner.schemas import DType, MatmulRecord


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
