"""Time of a layer's linear GEMMs (projections, MLP, shared and routed experts) on one rank, in the
high precision or under an FP8 recipe (``Precision.fp8``).

Without a recipe each GEMM and its two backward GEMMs run in ``Precision.gemm_inputs``
(``compute.gemm_time_s``). Under a recipe a linear layer the library converts (``fp8.converts``:
aligned, and for torchao not one of the small shapes its auto filter keeps in bf16) runs its
forward and input-gradient GEMMs in FP8 (MXFP8 on Blackwell's MX recipe), and its
weight-gradient GEMM too unless the recipe keeps it in bf16 (``RecipeRun.fp8_wgrad``), at the
device's FP8 peak and measured FP8 fraction (each preset's best pre-quantized FP8 GEMM rate:
references-fp8 §2); the router and a shared expert's gate stay in the high precision
(``Gemm.linear``), and so do routed experts where the stack keeps them there (``in_fp8``). Every
FP8 GEMM's operands are first quantized by memory-bound kernels, priced
at the device's memory bandwidth (references-fp8 §1.2, §6 rule 1): a quantization reads the
high-precision tensor ``RecipeRun.quantization_reads`` times (an amax pass, then the cast; once
under delayed scaling) and writes one FP8 byte per element for each layout it is used in:

- forward: the input, cast for the forward GEMM; Transformer Engine also writes its transpose
  (or columnwise copy), kept for the weight gradient; torchao keeps the bf16 input and casts it
  again in the backward (``RecipeRun.saves_fp8_inputs``). The weights likewise, except that
  Transformer Engine casts them once a step and keeps the copy for the step's micro-batches
  (``RecipeRun.caches_fp8_weights``): one micro-batch's share of that cast.
- backward: the output gradient, in both layouts (input gradient and weight gradient; one under
  a bf16 weight gradient); torchao casts the input (for the weight gradient, unless in bf16) and
  the weights (for the input gradient) again. Under torchao's rowwise recipe a kernel of its own
  rescales each FP8 backward GEMM's output, reading and writing it in the high precision
  (``RecipeRun.rescaled_backward``).

Blockwise scaling (1x128 / 128x128) runs on Hopper as software-emulated block-scaled GEMMs:
Transformer Engine's GEMM tutorial (H200 NVL, autocast) times a layer 22.882 ms under blockwise
against 20.285 ms under current scaling, whose quantization is about 17% of that time; with the
same two reads per quantized tensor the blockwise GEMMs run at 16.84 / 19.43 = 0.867 of the
per-tensor rate (``BLOCKWISE_HOPPER_RATE``). On Blackwell Transformer Engine emulates blockwise
with MXFP8: priced at the MXFP8 rate.
Units: seconds, bytes.
"""

from cost_models.compute import Gemm, backward_gemms_time_s, elementwise_time_s, gemm_time_s, gemms_time_s
from planner.schemas import DeviceProfile, DType
from planner.schemas.fp8 import Fp8Recipe, RecipeRun, converts
from planner.schemas.precision import Precision

BLOCKWISE_HOPPER_RATE = 0.867
"""A blockwise-scaled FP8 GEMM's rate over a per-tensor-scaled one's on Hopper (module docstring)."""


def forward_s(gemms: tuple[Gemm, ...], device: DeviceProfile, precision: Precision, micro_batches: int = 1) -> float:
    """Seconds of ``gemms``' forward on one rank, one micro-batch of the step's ``micro_batches``
    (over which Transformer Engine's cached FP8 weights are cast once)."""
    if precision.fp8 is None:
        return gemms_time_s(gemms, device, precision.gemm_inputs)
    return sum(_forward_s(g, device, precision, micro_batches) for g in gemms)


def backward_s(gemms: tuple[Gemm, ...], device: DeviceProfile, precision: Precision) -> float:
    """Seconds of ``gemms``' input- and weight-gradient GEMMs on one rank, one micro-batch."""
    if precision.fp8 is None:
        return backward_gemms_time_s(gemms, device, precision.gemm_inputs)
    return sum(_backward_s(g, device, precision) for g in gemms)


def fp8_change_s(
    gemms: tuple[Gemm, ...], device: DeviceProfile, precision: Precision, micro_batches: int = 1
) -> tuple[float, float]:
    """Seconds ``precision``'s FP8 recipe adds to the forward and to the backward of ``gemms``
    run in the high precision (negative where it saves; (0, 0) without a recipe): what a layer
    the profiler timed in the high precision changes by (``layer_time``)."""
    if precision.fp8 is None:
        return 0.0, 0.0
    high = precision.gemm_inputs
    return (
        forward_s(gemms, device, precision, micro_batches) - gemms_time_s(gemms, device, high),
        backward_s(gemms, device, precision) - backward_gemms_time_s(gemms, device, high),
    )


def in_fp8(gemm: Gemm, precision: Precision) -> bool:
    """Whether ``gemm`` (a forward GEMM, (m x k) @ (k x n): a weight of n x k) runs in FP8: a
    linear layer the library converts; routed experts' grouped GEMMs where the stack converts
    them (``Precision.fp8_experts``: Transformer Engine's grouped linear layers, the planner's
    runtime's per-expert linear layers; not torchtitan's grouped GEMMs, which torchao's
    Float8Linear does not convert)."""
    run = precision.fp8
    if run is None or not gemm.linear or (gemm.grouped and not precision.fp8_experts):
        return False
    return converts(run, gemm.k, gemm.n)


def _forward_s(gemm: Gemm, device: DeviceProfile, precision: Precision, micro_batches: int) -> float:
    run = precision.fp8
    if run is None or not in_fp8(gemm, precision):
        return gemm_time_s(gemm, device, precision.gemm_inputs)
    hp, fp8_layouts = precision.activations.bytes, 2 if run.saves_fp8_inputs else 1
    reads = run.quantization_reads
    inputs = _cast(gemm.m * gemm.k * gemm.batch, reads * hp + fp8_layouts, reads, device)
    weight_elements = gemm.k * gemm.n * gemm.batch
    if run.caches_fp8_weights:
        weights = _cast(weight_elements, reads * precision.weights.bytes + 2, reads, device) / max(1, micro_batches)
    else:
        weights = _cast(weight_elements, reads * precision.weights.bytes + 1, reads, device)
    return _fp8_gemm_s(gemm, device, run) + inputs + weights


def _backward_s(gemm: Gemm, device: DeviceProfile, precision: Precision) -> float:
    run = precision.fp8
    dgrad, wgrad = gemm.backward()
    if run is None or not in_fp8(gemm, precision):
        return gemm_time_s(dgrad, device, precision.gemm_inputs) + gemm_time_s(wgrad, device, precision.gemm_inputs)
    hp, reads = precision.activations.bytes, run.quantization_reads
    wgrad_s = _fp8_gemm_s(wgrad, device, run) if run.fp8_wgrad else gemm_time_s(wgrad, device, precision.gemm_inputs)
    layouts = 2 if run.fp8_wgrad else 1
    casts = _cast(gemm.m * gemm.n * gemm.batch, reads * hp + layouts, reads, device)  # the output gradient
    if not run.saves_fp8_inputs:  # torchao: the weights again for dgrad, the input again for an FP8 wgrad
        casts += _cast(gemm.k * gemm.n * gemm.batch, reads * precision.weights.bytes + 1, reads, device)
        if run.fp8_wgrad:
            casts += _cast(gemm.m * gemm.k * gemm.batch, reads * hp + 1, reads, device)
    if run.rescaled_backward:  # each FP8 backward GEMM's output read and written once more
        rescaled = gemm.m * gemm.k + (gemm.k * gemm.n if run.fp8_wgrad else 0)
        casts += _cast(rescaled * gemm.batch, 2 * hp, 1 + run.fp8_wgrad, device)
    return _fp8_gemm_s(dgrad, device, run) + wgrad_s + casts


def _fp8_gemm_s(gemm: Gemm, device: DeviceProfile, run: RecipeRun) -> float:
    """One GEMM's seconds in FP8 under ``run``, its operands already quantized."""
    if run.recipe is Fp8Recipe.BLOCKWISE:
        if DType.MXFP8 in device.peak_flop_per_s:  # Blackwell emulates it with MXFP8
            return gemm_time_s(gemm, device, DType.MXFP8)
        return gemm_time_s(gemm, device, DType.FP8) / BLOCKWISE_HOPPER_RATE
    return gemm_time_s(gemm, device, DType.MXFP8 if run.recipe is Fp8Recipe.MXFP8 else DType.FP8)


def _cast(elements: int, bytes_per_element: int, kernels: int, device: DeviceProfile) -> float:
    """Seconds of quantizing ``elements`` in ``kernels`` memory-bound kernels moving
    ``bytes_per_element`` each (the reads of the high precision, the FP8 bytes written)."""
    return elementwise_time_s(float(elements * bytes_per_element), device, kernels)
