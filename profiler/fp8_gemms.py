"""FP8 GEMMs timed at the profile's shapes, as an FP8 recipe's linear layers run them
(``planner profile --fp8 RECIPE``; CUDA only).

Each shape's operands are quantized once beforehand (E4M3, the recipe's scales: one per tensor,
or one per row and column for the rowwise recipes) and ``torch._scaled_mm`` is timed alone, with
a bf16 output: the pre-quantized rate the presets' FP8 figures are (ml-engineering's MAMF), so
that the cost model adds the quantization passes itself (``cost_models.linear_gemms``, priced at
the measured memory bandwidth). Blockwise and MXFP8 scales need kernels torch's scaled matmul
does not run on every GPU: they are timed with per-tensor scales (their GEMMs' rate is
per-tensor's on Blackwell, emulated on Hopper, which the cost model prices apart). A shape whose
dimensions are not multiples of 16 (cuBLAS's FP8 alignment) is skipped. Recorded as fp8 GEMMs
(mxfp8 under the MXFP8 recipe), beside the training precision's.
"""

import logging
from collections.abc import Iterable
from functools import partial

import torch

from planner.schemas import DType
from planner.schemas.fp8 import FP8_ALIGNMENT, Fp8Recipe
from profiler.context import Context
from profiler.stats import GemmSample

logger = logging.getLogger(__name__)

_ROWWISE = (Fp8Recipe.ROWWISE, Fp8Recipe.ROWWISE_GW_HP)


def fp8_gemms(ctx: Context, shapes: Iterable[tuple[int, int, int]]) -> list[GemmSample]:
    """Every aligned shape's FP8 GEMM under ``ctx.settings.fp8``; none without a recipe or off CUDA."""
    recipe = ctx.settings.fp8
    if recipe is None:
        return []
    if ctx.device.type != "cuda":
        if ctx.rank == 0:
            logger.warning(
                "--fp8 %s: FP8 GEMMs are timed on CUDA devices with FP8 tensor cores only; this profile of %s "
                "devices records none, and prices no FP8 plan",
                recipe,
                ctx.device.type,
            )
        return []
    dtype = DType.MXFP8 if recipe is Fp8Recipe.MXFP8 else DType.FP8
    aligned = [s for s in shapes if not any(d % FP8_ALIGNMENT for d in s)]
    timed = []
    for i, (m, n, k) in enumerate(aligned):
        ctx.at("ops", f"fp8 gemm {i + 1}/{len(aligned)} {m}x{n}x{k} {recipe}")
        a = torch.randn(m, k, device=ctx.device, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=ctx.device, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()  # column-major
        if recipe in _ROWWISE:
            scale_a = torch.ones(m, 1, device=ctx.device, dtype=torch.float32)
            scale_b = torch.ones(1, n, device=ctx.device, dtype=torch.float32)
        else:
            scale_a = scale_b = torch.ones((), device=ctx.device, dtype=torch.float32)
        mm = partial(torch._scaled_mm, a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        timing = ctx.time(mm, lockstep=True)
        timed.append(GemmSample(m, n, k, dtype, timing.median_s, timing.spread))
    return timed
