"""The FP8 copies of the weights a library keeps beside (or instead of) the high-precision ones,
per rank, in bytes (references-fp8 §1.3, §6 rule 3).

Transformer Engine casts a linear layer's weights to FP8 on a step's first micro-batch and keeps
that copy for the others (``RecipeRun.caches_fp8_weights``; TE ``module/linear.py``,
``is_first_microbatch``): on Hopper the FP8 data and its transpose (Hopper's FP8 GEMMs take one
layout only: TE issue 1261), 2 bytes a parameter; on Blackwell, whose GEMMs take either layout,
1 byte under a per-tensor recipe and 2 under MXFP8, whose rowwise and columnwise blocks are
quantized apart (TE issue 1880), plus one E8M0 scale per 32 elements each. With FP8 parameters
(``TrainingSpec.fp8_param_gather``: Megatron-LM's --fp8-param-gather) that copy is the weights
the layer holds, and the bf16 copy goes (TE issue 1764): the difference replaces it. torchao
keeps no copy (it casts every micro-batch, ``linear_gemms``); its FP8 all-gather only shrinks
what ZeRO-3 gathers (``Precision.parameter_gather``).

Under ZeRO-3 a rank holds a layer's weights only while it runs (``sharding``): its FP8 copy is
not counted (one gathered unit's worth at most). Only the layers the library converts count
(``linear_gemms.in_fp8``): not the router, embeddings, output layer or norms.
"""

from cost_models import layer_work as lw
from cost_models.linear_gemms import in_fp8
from planner.schemas import DeviceProfile, DType, Layout, ModelSpec, TrainingSpec, ZeroStage
from planner.schemas.fp8 import Fp8Recipe

MX_BLOCK = 32
"""Elements an MXFP8 scale covers."""


def fp8_weight_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, device: DeviceProfile, dense_layers: int, moe_layers: int
) -> float:
    """Bytes the FP8 weights of a rank's ``dense_layers`` and ``moe_layers`` add to its weights
    (negative where FP8 parameters hold less than the bf16 copy they replace)."""
    precision = training.precision
    run = precision.fp8
    if run is None or not run.caches_fp8_weights or layout.zero_stage is ZeroStage.PARAMETERS:
        return 0.0
    elements = 0
    for moe, count in ((False, dense_layers), (True, moe_layers)):
        if count:
            gemms = lw.layer_work(model, training, layout, moe=moe).dense_gemms
            elements += count * sum(g.k * g.n * g.batch for g in gemms if in_fp8(g, precision))
    copy = fp8_copy_bytes_per_param(run.recipe, device)
    held = copy - precision.weights.bytes if training.fp8_param_gather else copy
    return float(elements * held)


def fp8_copy_bytes_per_param(recipe: Fp8Recipe, device: DeviceProfile) -> float:
    """Bytes of one weight's FP8 copy as Transformer Engine keeps it on ``device`` (module docstring)."""
    if recipe is Fp8Recipe.MXFP8:
        return 2 * (1 + 1 / MX_BLOCK)
    blackwell = DType.MXFP8 in device.peak_flop_per_s  # GEMMs that take either layout
    return 1.0 if blackwell else 2.0
