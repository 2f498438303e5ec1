"""build_profile on GPUs by the names torch reports, from synthetic samples: the published peak
kept per known name, the GEMM efficiency measured in each precision, the tile/wave rule by device
kind, the workspace carried over, and a one-rank world (no links, no collectives)."""

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from cost_models.compute import Gemm, gemm_time_s
from planner.schemas import ClusterProfile, DeviceKind, DType, HostProfile
from planner.schemas.settings import ProfileSettings
from profiler.build import build_profile, host_of
from profiler.host_adam import HostAdam, adam_params_per_s
from profiler.host_copies import HostCopies, copy_bytes
from profiler.ops import GemmSample, OpsSample
from profiler.stats import Timing
from profiler.topology import RankInfo

SIDE = 4096
FLOP = 2.0 * SIDE**3
"""One 4096^3 GEMM: 2 * 4096^3 = 137,438,953,472 FLOP."""


def _rank(name: str, kind: DeviceKind = DeviceKind.CUDA, units: int = 132) -> RankInfo:
    return RankInfo(rank=0, host="gpu0", local_rank=0, local_world_size=1, device_name=name, device_kind=kind,
                    memory_bytes=80 * 2**30, compute_units=units)  # fmt: skip


def _ops(rates: dict[DType, float], workspace_bytes: int | None = None) -> OpsSample:
    """One rank's samples: a 4096^3 GEMM at each of ``rates`` (FLOP/s), HBM at 3e12 B/s."""
    gemms = tuple(GemmSample(SIDE, SIDE, SIDE, dtype, FLOP / rate, 0.0) for dtype, rate in rates.items())
    return OpsSample(gemms, 3e12, 5e-6, workspace_bytes=workspace_bytes)


def _one_gpu(
    name: str, rates: dict[DType, float], kind: DeviceKind = DeviceKind.CUDA, units: int = 132
) -> ClusterProfile:
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    return build_profile(settings, [_rank(name, kind, units)], [[]], [[]], [_ops(rates)], backend="nccl")


def test_an_h100_keeps_its_published_peaks_and_measures_each_precisions_share() -> None:
    # bf16 at 70% of 989 TFLOP/s (692.3e12), fp32 at 60% of 67 TFLOP/s (40.2e12)
    profile = _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12, DType.FP32: 40.2e12})
    device = profile.device
    assert device.peak_flop_per_s == {DType.BF16: 989e12, DType.FP16: 989e12, DType.FP32: 67e12}
    assert device.matmul.fraction(DType.BF16) == pytest.approx(0.7)
    assert device.matmul.fraction(DType.FP32) == pytest.approx(0.6)
    assert device.matmul.fraction(DType.FP16) == pytest.approx(0.7)  # not timed: bf16's
    assert (device.matmul.compute_units, device.matmul.tile_m, device.matmul.tile_n) == (132, 256, 128)


def test_fp8_is_priced_only_where_the_profile_timed_it() -> None:
    # without --fp8 the H100's FP8 peak is left out (no FP8 plan is priced on a guessed share);
    # with it, FP8 keeps its published peak and its own measured share (1400 of 1979 TFLOP/s)
    assert DType.FP8 not in _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12}).device.peak_flop_per_s
    device = _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12, DType.FP8: 1400e12}).device
    assert device.peak_flop_per_s[DType.FP8] == 1979e12
    assert device.matmul.fraction(DType.FP8) == pytest.approx(1400 / 1979)
    assert device.matmul.fraction(DType.BF16) == pytest.approx(0.7)


def test_an_fp32_only_profile_prices_bf16_at_fp32s_share_not_at_a_thousandth() -> None:
    profile = _one_gpu("NVIDIA H100 80GB HBM3", {DType.FP32: 40.2e12})
    assert profile.device.matmul.fraction(DType.FP32) == pytest.approx(0.6)
    assert profile.device.matmul.fraction(DType.BF16) == pytest.approx(0.6)
    # an unmeasured bf16 shape: 0.6 * 989e12 on 16 x 32 = 512 tiles over 132 units (4 waves, 97%)
    unmeasured = Gemm(m=SIDE, n=SIDE, k=2 * SIDE)
    compute_s = 2.0 * SIDE * SIDE * 2 * SIDE / (0.6 * 989e12 * (512 / 528))
    assert gemm_time_s(unmeasured, profile.device, DType.BF16) == pytest.approx(5e-6 + compute_s)


def test_each_precision_prices_unmeasured_shapes_at_its_own_share() -> None:
    profile = _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12, DType.FP32: 40.2e12})
    unmeasured = Gemm(m=SIDE, n=SIDE, k=2 * SIDE)
    bf16_s = gemm_time_s(unmeasured, profile.device, DType.BF16) - 5e-6
    fp32_s = gemm_time_s(unmeasured, profile.device, DType.FP32) - 5e-6
    assert fp32_s / bf16_s == pytest.approx((0.7 * 989e12) / (0.6 * 67e12))


@pytest.mark.parametrize(
    ("name", "bf16_peak", "fp32_peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12, 19.5e12),
        ("NVIDIA H200", 989e12, 67e12),
        ("NVIDIA B200", 2250e12, 80e12),
        ("NVIDIA GB200", 2500e12, 80e12),
    ],
)
def test_known_gpus_keep_their_published_peaks(name: str, bf16_peak: float, fp32_peak: float) -> None:
    profile = _one_gpu(name, {DType.BF16: 0.75 * bf16_peak}, units=148)
    device = profile.device
    assert device.peak_flop_per_s[DType.BF16] == bf16_peak and device.peak_flop_per_s[DType.FP32] == fp32_peak
    assert device.matmul.fraction(DType.BF16) == pytest.approx(0.75)
    assert (device.matmul.compute_units, device.matmul.tile_m, device.matmul.tile_n) == (148, 256, 128)


def test_an_unknown_cuda_gpu_takes_its_best_rate_as_peak_with_the_wave_model() -> None:
    profile = _one_gpu("NVIDIA L40S", {DType.BF16: 300e12}, units=142)
    device = profile.device
    assert device.peak_flop_per_s == {DType.BF16: pytest.approx(300e12), DType.FP16: pytest.approx(300e12)}
    assert device.matmul.peak_fraction == 1.0 and device.matmul.peak_fraction_by_dtype == {}
    assert (device.matmul.compute_units, device.matmul.tile_m, device.matmul.tile_n) == (142, 256, 128)


def test_a_rocm_gpu_gets_no_wave_model() -> None:
    profile = _one_gpu("AMD Instinct MI250X", {DType.BF16: 150e12}, kind=DeviceKind.ROCM, units=110)
    matmul = profile.device.matmul
    assert (matmul.compute_units, matmul.tile_m, matmul.tile_n) == (1, 1, 1)


def test_a_one_rank_world_builds_without_links_or_collectives_and_says_what_it_left_out() -> None:
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    ops = [_ops({DType.BF16: 692.3e12}, workspace_bytes=3 * 2**20)]
    note = ("links: one rank",)
    profile = build_profile(settings, [_rank("NVIDIA H100 80GB HBM3")], [[]], [[]], ops, backend="nccl",
                            not_measured=note)  # fmt: skip
    assert profile.world_size == 1 and profile.collectives == ()
    assert profile.provenance.not_measured == note
    assert profile.device.workspace_bytes == 3 * 2**20


def test_a_matmul_model_with_shares_by_precision_hashes_as_the_cost_models_memos_need() -> None:
    one = _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12, DType.FP32: 40.2e12}).device.matmul
    again = _one_gpu("NVIDIA H100 80GB HBM3", {DType.FP32: 40.2e12, DType.BF16: 692.3e12}).device.matmul
    assert one == again and hash(one) == hash(again)


def test_host_copies_are_carried_into_the_profile_and_absent_where_unmeasured() -> None:
    settings = ProfileSettings(latency_bytes=0, bandwidth_bytes=2**20)
    rates = {DType.BF16: 692.3e12}
    sample = replace(_ops(rates), host_copies=HostCopies(22e9, 24e9))  # PCIe 5.0 x16 pinned: 22 up, 24 GB/s down
    profile = build_profile(settings, [_rank("NVIDIA H100 80GB HBM3")], [[]], [[]], [sample], backend="nccl")
    assert profile.device.host_to_device_bytes_per_s == 22e9
    assert profile.device.device_to_host_bytes_per_s == 24e9
    assert _one_gpu("NVIDIA H100 80GB HBM3", rates).device.host_to_device_bytes_per_s is None


def test_host_copies_move_past_the_copy_engines_start_up() -> None:
    assert copy_bytes(16 * 2**20) == 64 * 2**20  # the quick profile's stream operand
    assert copy_bytes(64 * 2**20) == 256 * 2**20


def test_a_nodes_cpu_adam_is_its_ranks_stepping_at_once_and_the_slowest_node_prices_every_host() -> None:
    # two nodes of two GPUs: node 0's ranks step 1.0e9 and 1.5e9 parameters a second at once, node
    # 1's 0.5e9 each; hosts of 2.0e12 and 1.5e12 bytes
    rates, memory = (1.0e9, 1.5e9, 0.5e9, 0.5e9), (2 * 10**12, 2 * 10**12, 15 * 10**11, 15 * 10**11)
    ops = [replace(_ops({DType.BF16: 692.3e12}), host_adam=HostAdam(r, m)) for r, m in zip(rates, memory, strict=True)]
    node_of = {0: 0, 1: 0, 2: 1, 3: 1}
    assert host_of(ops, node_of, 2) == HostProfile(memory_bytes=15 * 10**11, adam_params_per_s=1.0e9)
    assert host_of([replace(o, host_adam=None) for o in ops], node_of, 2) is None
    profile = _one_gpu("NVIDIA H100 80GB HBM3", {DType.BF16: 692.3e12})
    assert profile.host is None  # a rank that did not measure it: no host


def test_the_cpu_adam_rate_is_timed_on_the_runtimes_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[object] = []

    class Clock:  # every step timed at 0.5 s: 2^20 parameters at 2,097,152 a second
        def time(self, fn: Callable[[], object], *, lockstep: bool = False) -> Timing:
            assert lockstep
            fn()
            timed.append(getattr(fn, "__self__", None))
            return Timing(median_s=0.5, spread=0.0)

    assert adam_params_per_s(Clock(), elements=2**20) == 2**21  # type: ignore[arg-type]
    (optimizer,) = timed
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["weight_decay"] == 0.0
