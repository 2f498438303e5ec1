"""A GEMM's per-tile cost beside its loop over k: compute time x (1 + k_overhead / k).

Hand-worked values on a one-tile device, and the profile's measured record of the exact shape
still winning.
"""

import pytest

from cost_models.compute import Gemm, gemm_time_s, reduction_overhead
from planner.schemas import DeviceKind, DeviceProfile, DType, MatmulModel, MatmulRecord


def _one_tile_device(k_overhead: float, records: tuple[MatmulRecord, ...] = ()) -> DeviceProfile:
    """100 TFLOP/s at peak_fraction 0.5, one 128 x 128 tile per wave, no launch cost, memory never binds."""
    return DeviceProfile(
        name="test",
        kind=DeviceKind.CUDA,
        memory_bytes=2**34,
        peak_flop_per_s={DType.BF16: 100e12},
        memory_bandwidth_bytes_per_s=1e18,
        matmul=MatmulModel(
            peak_fraction=0.5, compute_units=1, tile_m=128, tile_n=128, launch_overhead_s=0.0, k_overhead=k_overhead
        ),
        matmul_records=records,
    )


def test_hand_worked_times() -> None:
    device = _one_tile_device(k_overhead=140)
    # 2 * 128 * 128 * 140 FLOP = 4587520 at 50e12 FLOP/s = 91.7504 ns, doubled at k = k_overhead.
    assert gemm_time_s(Gemm(128, 128, 140), device, DType.BF16) == pytest.approx(2 * 91.7504e-9)
    # k = 2048: 67108864 FLOP / 50e12 = 1.34217728 us, x (1 + 140 / 2048) = 1.068359375.
    assert reduction_overhead(Gemm(128, 128, 2048), device) == 1.068359375
    assert gemm_time_s(Gemm(128, 128, 2048), device, DType.BF16) == pytest.approx(1.34217728e-6 * 1.068359375)
    # Without the figure a GEMM is priced as before.
    assert gemm_time_s(Gemm(128, 128, 2048), _one_tile_device(0.0), DType.BF16) == pytest.approx(1.34217728e-6)


def test_a_measured_record_of_the_shape_still_wins() -> None:
    record = MatmulRecord(m=128, n=128, k=2048, dtype=DType.BF16, time_s=3e-6)
    device = _one_tile_device(k_overhead=140, records=(record,))
    assert gemm_time_s(Gemm(128, 128, 2048, batch=2), device, DType.BF16) == 6e-6
