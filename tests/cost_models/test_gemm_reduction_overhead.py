"""A GEMM's per-tile cost beside its loop over k: compute time x (1 + k_overhead / k).

Hand-worked values on a one-tile device, the published H100 points the preset's k_overhead
comes from (planner/presets/clusters/dgx-h100.yaml: xla-gemm-table, tilelang-h800), and the
profile's measured record of the exact shape still winning.
"""

import pytest

from cost_models.compute import Gemm, gemm_time_s, reduction_overhead
from planner.files.cluster_presets import cluster_preset
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


def test_presets_without_the_figure_keep_their_pricing() -> None:
    assert cluster_preset("dgx-a100-80g", 1).device.matmul.k_overhead == 0.0
    assert cluster_preset("dgx-h100", 1).device.matmul.k_overhead == 140


def _h100_rate(batch: int, m: int, n: int, k: int) -> float:
    device = cluster_preset("dgx-h100", 1).device
    gemm = Gemm(m, n, k, batch)
    return gemm.flop / gemm_time_s(gemm, device, DType.BF16)


# The sources' absolute levels differ from the preset's (and from each other's), so each point is
# its rate over the same source's rate at its longest k, as is the model's.
XLA_SM90_B4_M4096 = {  # n: {k: TFLOP/s}
    4096: {512: 620, 1024: 722, 2048: 760, 4096: 789},
    2048: {512: 613, 1024: 690, 2048: 758, 4096: 805},
    1024: {512: 548, 1024: 678, 2048: 717, 4096: 774},
}
TILELANG_H800_M8192_N8192 = {2048: 705, 4096: 736, 8192: 758, 16384: 766}


@pytest.mark.parametrize("n", sorted(XLA_SM90_B4_M4096))
def test_the_xla_h100_table_is_reproduced_within_3_5_percent(n: int) -> None:
    points = XLA_SM90_B4_M4096[n]
    for k, tflops in points.items():
        model = _h100_rate(4, 4096, n, k) / _h100_rate(4, 4096, n, 4096)
        assert model == pytest.approx(tflops / points[4096], rel=0.035), (n, k)


def test_the_tilelang_k_sweep_is_reproduced_within_2_percent() -> None:
    points = TILELANG_H800_M8192_N8192
    for k, tflops in points.items():
        model = _h100_rate(1, 8192, 8192, k) / _h100_rate(1, 8192, 8192, 16384)
        assert model == pytest.approx(tflops / points[16384], rel=0.02), k
