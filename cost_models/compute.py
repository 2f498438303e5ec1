"""Time of the kernels a layer runs on one device: GEMMs by shape, memory-bound elementwise work.

GEMMs are priced from the cluster profile: a measured record of the exact shape when the profile
has one, else the profile's MatmulModel, a roofline whose compute side is reduced by tile and
wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide": a GEMM's output is
cut into tiles that run in waves over the compute units; a partly filled last wave and partly
filled edge tiles waste their share), and by each tile's fixed cost beside its loop over the
reduction dimension k (``reduction_overhead``). A fused (FlashAttention) attention core runs at its own
rate, which the profile's attention records give by sequence length and head size
(``fused_attention_s``). Elementwise kernels are bound by memory bandwidth.
Units: FLOP, bytes, seconds.
"""

import math
from dataclasses import dataclass

from planner.schemas import (
    AttentionKernel,
    AttentionRecord,
    DeviceProfile,
    DType,
    LayerRecord,
    OpKind,
    OptimizerRecord,
    PipelineSlotRecord,
    ShardedUnitRecord,
    ZeroStage,
)


@dataclass(frozen=True, slots=True)
class Gemm:
    """``batch`` independent (m x k) @ (k x n) products."""

    m: int
    n: int
    k: int
    batch: int = 1
    linear: bool = True
    """Whether it is a linear layer's GEMM, which an FP8 recipe runs in FP8 (``cost_models.fp8``);
    False for the GEMMs every recipe keeps in the high precision (an MoE router, a shared
    expert's gate)."""
    grouped: bool = False
    """Whether it is the routed experts' grouped GEMM (``batch`` experts), which torchao's
    Float8Linear does not convert (``cost_models.linear_gemms``)."""

    @property
    def flop(self) -> float:
        """2 m n k per product (one multiply and one add)."""
        return 2.0 * self.m * self.n * self.k * self.batch

    def io_bytes(self, element_bytes: int) -> float:
        """Bytes of both inputs and the output, read or written once."""
        return float(element_bytes * self.batch * (self.m * self.k + self.k * self.n + self.m * self.n))

    def backward(self) -> tuple["Gemm", "Gemm"]:
        """The input-gradient (m x n)(n x k) and weight-gradient (k x m)(m x n) GEMMs."""
        return Gemm(self.m, self.k, self.n, self.batch), Gemm(self.k, self.n, self.m, self.batch)


def quantization_efficiency(gemm: Gemm, device: DeviceProfile) -> float:
    """Useful share of the tiles and waves a GEMM launches, in (0, 1]."""
    mm = device.matmul
    tiles_m, tiles_n = math.ceil(gemm.m / mm.tile_m), math.ceil(gemm.n / mm.tile_n)
    tile_eff = (gemm.m * gemm.n) / (tiles_m * mm.tile_m * tiles_n * mm.tile_n)
    tiles = tiles_m * tiles_n * gemm.batch
    wave_eff = tiles / (math.ceil(tiles / mm.compute_units) * mm.compute_units)
    return tile_eff * wave_eff


def reduction_overhead(gemm: Gemm, device: DeviceProfile) -> float:
    """1 + k_overhead / k: each output tile's fixed cost beside its loop over k, as a factor >= 1
    on the compute time (the measured GEMM tables run a short reduction below the long one's
    rate, e.g. an H100's rate at k = 1024 about 10% below its rate at k = 8192)."""
    return 1.0 + device.matmul.k_overhead / gemm.k


def gemm_time_s(gemm: Gemm, device: DeviceProfile, gemm_dtype: DType) -> float:
    """Seconds for ``gemm`` computed in ``gemm_dtype`` (``Precision.gemm_inputs``, or
    ``Precision.attention`` for the attention core's): a measured record of its shape in that
    precision, else the roofline model at the device's peak in it.

    Model: launch overhead + max(flop / (peak * fraction(dtype) * quantization efficiency)
    * (1 + k_overhead / k), io_bytes / memory bandwidth), inputs and output in ``gemm_dtype``.
    """
    for rec in device.matmul_records:
        if rec.dtype is gemm_dtype and (rec.m, rec.n, rec.k) == (gemm.m, gemm.n, gemm.k):
            return rec.time_s * gemm.batch
    achievable = device.get_peak_flop_per_s(gemm_dtype) * device.matmul.fraction(gemm_dtype)
    compute_s = gemm.flop / (achievable * quantization_efficiency(gemm, device)) * reduction_overhead(gemm, device)
    memory_s = gemm.io_bytes(gemm_dtype.bytes) / device.memory_bandwidth_bytes_per_s
    return device.matmul.launch_overhead_s + max(compute_s, memory_s)


def gemms_time_s(gemms: tuple[Gemm, ...], device: DeviceProfile, gemm_dtype: DType) -> float:
    """Sum of :func:`gemm_time_s` over ``gemms``, computed in ``gemm_dtype``."""
    return sum(gemm_time_s(g, device, gemm_dtype) for g in gemms)


def backward_gemms_time_s(gemms: tuple[Gemm, ...], device: DeviceProfile, gemm_dtype: DType) -> float:
    """Input- and weight-gradient GEMMs of every forward GEMM in ``gemms``, computed in ``gemm_dtype``."""
    return sum(gemm_time_s(b, device, gemm_dtype) for g in gemms for b in g.backward())


def fused_attention_s(
    flop: float,
    seq_len: int,
    head_size: int,
    device: DeviceProfile,
    attention_dtype: DType,
    kernel: AttentionKernel = AttentionKernel.FLASH,
    *,
    causal: bool = True,
) -> tuple[float, float] | None:
    """Forward and backward seconds of a fused attention core of ``flop`` forward FLOPs, causal or
    without a mask (``causal``), at the rates of the profile's attention records of ``kernel`` and
    that mask (the profiler's timing, or a preset's published kernel figures), None without a
    record in ``attention_dtype``. A profile with no record of that kernel prices it at the fused kernel it
    has records of (what its SDPA ran: the profiler times one, a preset may publish several); one
    with no unmasked record prices unmasked attention at the causal records' rates (a version-8
    profile, or a preset whose source publishes causal figures only): slower than it runs, a
    causal kernel's partly masked tiles making its rate the lower one.

    FLOPs are counted as the FlashAttention papers count them (Dao 2023, Sec. 4.1; Shah et al.
    2024, Sec. 4.1): forward 4 s^2 d per head and sequence over the full s x s, halved under the
    causal mask; the backward's five GEMMs to the forward's two make it 2.5 x the forward's. A
    record's rates are those FLOPs over its times. The records of the head size nearest to
    ``head_size`` (by ratio) are read; between two recorded lengths the rates are interpolated
    linearly in log2(s), beyond the ends the nearest length's rates hold.

    Args:
        flop: forward FLOPs of the attention core: 4 d per query-key pair it computes and head (a
            causal call's visible pairs, half of its s x s).
        seq_len: tokens per sequence the kernel sees (per block under ring attention).
        head_size: query/key head dimension.
        device: the device and its records.
        attention_dtype: what the kernel computes in (``Precision.attention``).
        kernel: the fused kernel the stack runs (``TrainingSpec.attention_kernel``).
        causal: whether the attention runs under a causal mask.

    Returns:
        (forward_s, backward_s), or None.
    """
    records = [r for r in device.op_records if isinstance(r, AttentionRecord) and r.dtype is attention_dtype]
    records = [r for r in records if r.kernel is kernel] or records
    records = [r for r in records if r.causal is causal] or [r for r in records if r.causal] or records
    if not records:
        return None
    nearest = min(records, key=lambda r: abs(math.log(r.head_size / head_size)))
    rates = sorted(_attention_rates(r) for r in records if r.head_size == nearest.head_size)
    x = math.log2(seq_len)
    below = [p for p in rates if p[0] <= x] or rates[:1]
    above = [p for p in rates if p[0] >= x] or rates[-1:]
    (x0, fwd0, bwd0), (x1, fwd1, bwd1) = below[-1], above[0]
    w = 0.0 if x1 == x0 else min(max((x - x0) / (x1 - x0), 0.0), 1.0)
    forward_rate, backward_rate = fwd0 + w * (fwd1 - fwd0), bwd0 + w * (bwd1 - bwd0)
    return flop / forward_rate, 2.5 * flop / backward_rate


def _attention_rates(record: AttentionRecord) -> tuple[float, float, float]:
    """(log2 s, forward FLOP/s, backward FLOP/s) of one attention record, causal or unmasked."""
    r, flop = record, record.forward_flop
    # Under noise a forward can time longer than forward + backward: keep the backward above zero.
    backward_s = max(r.fwd_bwd_time_s - r.fwd_time_s, 1e-3 * r.fwd_bwd_time_s)
    return math.log2(r.seq_len), flop / r.fwd_time_s, 2.5 * flop / backward_s


def elementwise_time_s(bytes_moved: float, device: DeviceProfile, kernels: int = 0) -> float:
    """Memory-bound kernels: bytes read plus written over the achievable memory bandwidth, and
    the launch overhead of each of ``kernels`` kernels (as every GEMM pays it)."""
    return bytes_moved / device.memory_bandwidth_bytes_per_s + kernels * device.matmul.launch_overhead_s


def measured_layer_s(
    device: DeviceProfile,
    model_name: str,
    weights_dtype: DType,
    tensor_parallel: int,
    micro_batch: int,
    seq_len: int,
    *,
    sequence_parallel: bool | None = None,
) -> tuple[float, float] | None:
    """Forward and backward seconds of one of the model's own layers, as the profiler timed it
    (``planner profile --model``): the local layer of one tensor-parallel rank, or with
    ``sequence_parallel`` given the real tensor-parallel layer, collectives included. The record
    of this micro-batch size, else the line through the two measured sizes nearest to it (a
    fixed cost per call plus a cost per sequence, which is how small layers scale on CPUs and
    launch-bound GPUs). None without a record of this model, precision (``weights_dtype``, the
    precision the profiler built the runtime's layer in: ``Precision.weights``), tensor-parallel
    degree and sequence length."""
    op = OpKind.LAYER if sequence_parallel is None else OpKind.TP_LAYER
    return _measured_s(device, op, model_name, weights_dtype, tensor_parallel, seq_len, sequence_parallel, micro_batch)


def measured_moe_layer_s(
    device: DeviceProfile, model_name: str, weights_dtype: DType, tensor_parallel: int, micro_batch: int, seq_len: int
) -> tuple[float, float] | None:
    """Forward and backward seconds of one of an MoE model's layers as the runtime builds it
    (attention, router, top-k routing and every expert on the rank: expert-parallel degree 1),
    as the profiler timed it (``planner profile --model``, cluster profile version 3). Between
    micro-batch sizes and precision as ``measured_layer_s``. None without a record: a version-2
    profile, a dense model, a model whose MoE layer the runtime does not build as it is, or tensor
    parallelism (timed at degree 1 only)."""
    return _measured_s(device, OpKind.MOE_LAYER, model_name, weights_dtype, tensor_parallel, seq_len, None, micro_batch)


def measured_output_layer_s(
    device: DeviceProfile,
    model_name: str,
    weights_dtype: DType,
    tensor_parallel: int,
    micro_batch: int,
    seq_len: int,
    *,
    sequence_parallel: bool,
) -> float | None:
    """Forward + backward seconds of the model's own output layer (final norm, head and loss) on
    one tensor-parallel rank, as the profiler timed the runtime's (``planner profile --model``):
    under tensor parallelism, split over the vocabulary with its collectives and the
    vocabulary-parallel loss. Between micro-batch sizes and precision as ``measured_layer_s``;
    None without a record."""
    split = sequence_parallel and tensor_parallel > 1  # tp 1 is timed unsplit: sequence parallel means nothing there
    measured = _measured_s(
        device, OpKind.OUTPUT_LAYER, model_name, weights_dtype, tensor_parallel, seq_len, split, micro_batch
    )
    return None if measured is None else measured[0] + measured[1]


def _measured_s(
    device: DeviceProfile,
    op: OpKind,
    model_name: str,
    weights_dtype: DType,
    tensor_parallel: int,
    seq_len: int,
    sequence_parallel: bool | None,
    micro_batch: int,
) -> tuple[float, float] | None:
    """(forward, backward) of the ``op`` layer records of this model, precision (``weights_dtype``),
    tensor-parallel degree, sequence length and sequence parallelism: the record of ``micro_batch``, else the
    line through the two nearest sizes, or beyond the largest the least-squares slope over all
    of them."""
    points = sorted(
        (rec.micro_batch_size, rec.fwd_time_s, rec.fwd_bwd_time_s)
        for rec in device.op_records
        if isinstance(rec, LayerRecord)
        and rec.op is op
        and rec.model == model_name
        and rec.dtype is weights_dtype
        and rec.tensor_parallel_degree == tensor_parallel
        and rec.seq_len == seq_len
        and rec.sequence_parallel == sequence_parallel
    )
    if not points:
        return None
    # Under noise a forward can time longer than forward + backward; a backward is never negative.
    by_size = {b: (fwd, max(0.0, both - fwd)) for b, fwd, both in points}
    if micro_batch in by_size:
        return by_size[micro_batch]
    sizes = sorted(by_size)
    if len(sizes) == 1:
        fwd, bwd = by_size[sizes[0]]
        return fwd * micro_batch / sizes[0], bwd * micro_batch / sizes[0]
    if micro_batch > sizes[-1]:
        # Beyond the largest size, the least-squares slope over every size: the two largest
        # alone can come out flat, or even falling, under noise.
        top = sizes[-1]
        fwd_slope, bwd_slope = (_least_squares_slope(sizes, [by_size[b][i] for b in sizes]) for i in (0, 1))
        fwd, bwd = by_size[top]
        return fwd + fwd_slope * (micro_batch - top), bwd + bwd_slope * (micro_batch - top)
    a, b = sorted(sizes, key=lambda size: (abs(size - micro_batch), size))[:2]
    lo, hi = min(a, b), max(a, b)

    def line(i: int) -> float:
        slope = max(0.0, (by_size[hi][i] - by_size[lo][i]) / (hi - lo))
        return max(by_size[lo][i] + slope * (micro_batch - lo), 0.0) or by_size[lo][i] * micro_batch / lo

    return line(0), line(1)


def _least_squares_slope(xs: list[int], ys: list[float]) -> float:
    """The slope of the least-squares line through (xs, ys), at least 0."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread)


def measured_optimizer_s(
    device: DeviceProfile, model_name: str, params: float, weights_dtype: DType | None = None
) -> float | None:
    """Seconds of an optimizer step over ``params`` parameters, at the rate the profiler timed on
    the model's own layer (``planner profile --model``): the record of the weights' precision
    (``Precision.weights``: fp32 steps the parameters, bf16/fp16 their fp32 masters slice by
    slice, a different cost), else any record of the model (a version-9 profile timed one, fp32
    masters; None for ``weights_dtype`` also takes any); None without such a record."""
    records = [r for r in device.op_records if isinstance(r, OptimizerRecord) and r.model == model_name]
    rec = next((r for r in records if r.dtype is weights_dtype), records[0] if records else None)
    return None if rec is None else rec.time_s * params / rec.num_parameters


def measured_pipeline_slot_s(device: DeviceProfile) -> float | None:
    """Seconds of one slot of a tiny 2-stage 1F1B schedule (a forward, a backward and their two
    transfers, nothing to compute), as the profiler timed it; None without the record."""
    for rec in device.op_records:
        if isinstance(rec, PipelineSlotRecord):
            return rec.time_s
    return None


def measured_sharded_unit_s(
    device: DeviceProfile, zero_stage: ZeroStage, deferred: bool, weights_dtype: DType
) -> float | None:
    """Seconds sharded data parallelism (FSDP) spends of its own on one unit and micro-batch,
    beyond the unit's compute and its collectives (hooks, casts, buffer copies), as the profiler
    timed it with the runtime's weights in ``weights_dtype`` (``Precision.weights``; else in any
    precision); None without the record."""
    records = [
        r
        for r in device.op_records
        if isinstance(r, ShardedUnitRecord) and r.zero_stage == zero_stage and r.deferred == deferred
    ]
    own = [r for r in records if r.dtype is weights_dtype] or records
    return own[0].time_s if own else None
