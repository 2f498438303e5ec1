"""FP8 training recipes as users name them, the two libraries that run them, and what each
(library, recipe) does to a training step: which GEMMs run in FP8, how often a tensor is read to
quantize it, whether weights can be all-gathered in FP8, what the library keeps in memory, and on
which devices it runs.

Two libraries run FP8 training: NVIDIA's Transformer Engine (Megatron-LM, Megatron-Bridge, LLM
Foundry's Composer) and torchao's float8 (torchtitan, NeMo AutoModel, and this planner's runtime).
They name the same idea differently (TE's ``Float8CurrentScaling`` is torchao's ``tensorwise``) and
do different things around the GEMM: TE saves a linear layer's input in FP8 and caches an FP8 copy
of the weights across micro-batches; torchao saves the high-precision input and casts again in the
backward. ``RECIPE_RUNS`` is the one table of those facts, each with its source; the cost models,
the stacks (``Stack.fp8_library``), the exports and the runtime read it.

Every recipe keeps attention, norms, activations, embeddings, the output layer, the router, the
loss and the optimizer in the high precision (bf16): only the linear layers' GEMMs change
(Transformer Engine's GEMM profiling tutorial; torchao's float8 README).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from planner.schemas.errors import SchemaError


class Fp8Recipe(StrEnum):
    """How tensors are scaled to FP8, as users name the recipes (Megatron-LM's ``--fp8-recipe``,
    torchao's ``recipe_name``)."""

    DELAYED = "delayed"
    """One scale per tensor from an amax history (TE ``DelayedScaling``, Megatron's default)."""
    TENSORWISE = "tensorwise"
    """One scale per tensor from the tensor itself (TE ``Float8CurrentScaling``, torchao tensorwise)."""
    ROWWISE = "rowwise"
    """One power-of-2 scale per row (torchao rowwise)."""
    ROWWISE_GW_HP = "rowwise-gw-hp"
    """Rowwise, with the weight-gradient GEMM in bf16 (torchao ``rowwise_with_gw_hp``)."""
    BLOCKWISE = "blockwise"
    """1x128 blocks for activations and gradients, 128x128 for weights (TE ``Float8BlockScaling``,
    DeepSeek-V3's recipe)."""
    MXFP8 = "mxfp8"
    """1x32 blocks with E8M0 scales, on Blackwell's tensor cores (TE ``MXFP8BlockScaling``, torchao MX)."""


class Fp8Library(StrEnum):
    """The library that runs a stack's FP8 linear layers."""

    TRANSFORMER_ENGINE = "transformer-engine"
    TORCHAO = "torchao"


class Fp8Devices(StrEnum):
    """The tensor cores a recipe needs."""

    FP8 = "fp8"
    """FP8 tensor cores: Hopper (H100, H200), Ada and Blackwell."""
    MXFP8 = "mxfp8"
    """Block-scaled (MX) FP8 tensor cores: Blackwell (B200, GB200, B300) only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeRun:
    """What one library's recipe does in a training step."""

    library: Fp8Library
    recipe: Fp8Recipe
    library_name: str
    """The recipe's name in the library (what an export writes)."""
    fp8_wgrad: bool
    """Whether the weight-gradient GEMM runs in FP8 (the forward and input-gradient GEMMs always do)."""
    quantization_reads: int
    """Reads of a bf16 tensor to quantize it: 1 where the scale is known before the cast (delayed),
    2 where an amax pass precedes it, or where each of two scaled layouts is cast from bf16."""
    fp8_param_gather: bool
    """Whether sharded weights can be all-gathered in FP8 (half the bytes of bf16), when asked."""
    fp8_sequence_gather: bool
    """Whether sequence parallelism's all-gather of a linear layer's input carries it quantized,
    in FP8 (Transformer Engine's per-tensor and blockwise recipes; torchao's tensorwise), rather
    than in bf16 (references-fp8 §1.4)."""
    saves_fp8_inputs: bool
    """Whether a linear layer keeps its input for the backward in FP8 (TE) rather than bf16 (torchao)."""
    caches_fp8_weights: bool
    """Whether an FP8 copy of the weights is kept across a step's micro-batches beside the bf16 copy
    (TE without FP8 parameters)."""
    micro_pipelined_share: float = 1.0
    """The share of a layer's tensor-parallel collectives that run behind GEMMs under a tensor-parallel
    overlap (``TrainingSpec.tp_comm_overlap``). Transformer Engine's userbuffers overlap every one.
    torchao's recipes are overlapped by torch's micro-pipeline pass (async TP under torch.compile:
    ``torch/_inductor/fx_passes/micro_pipeline_tp.py``), which fuses an all-gather only into the
    matmuls that consume its output and a reduce-scatter only with the matmul that produces its
    input. Tensorwise gathers FP8 inputs straight into its scaled matmuls: all four (the forward's
    and the backward's gathers and reduce-scatters, of equal size). Rowwise quantizes each gathered
    input per row before its matmul, so neither pass's gather fuses, and rescales its backward
    GEMMs' outputs in a kernel of its own (``rescaled_backward``), so neither does the backward's
    reduce-scatter: the forward's reduce-scatters alone, a quarter. Rowwise with the weight
    gradient in bf16 and MXFP8 quantize gathered inputs too: the reduce-scatters, half."""
    rescaled_backward: bool = False
    """Whether the input- and weight-gradient GEMMs run unscaled and a kernel of their own then
    multiplies each output by its row and column scales: torchao's rowwise recipe runs its
    backward's slow-accumulation GEMMs so, as cuBLAS's per-tensor kernel ("one extra triton kernel
    per GEMM ... just for the rescaling": torchao issue 2184; float8_ops.addmm_float8_unwrapped)."""
    devices: Fp8Devices
    source: str


_TE_RECIPES = "TransformerEngine transformer_engine/common/recipe/__init__.py and docs/features/low_precision_training/"
_TE_MEMORY = (
    "TE module/linear.py caches the FP8 weights across micro-batches (is_first_microbatch); TE issue 1764: "
    "linear inputs saved in FP8 (a 50% activation reduction, Megatron MoE README)"
)
_TORCHAO_CONFIG = "torchao torchao/float8/config.py (Float8LinearConfig.from_recipe_name)"
_TORCHAO_MEMORY = "torchao float8_linear.py saves input_hp and weight_hp_t and casts again in the backward"


def _te(recipe: Fp8Recipe, library_name: str, *, reads: int, gather: bool, devices: Fp8Devices, why: str) -> RecipeRun:
    return RecipeRun(
        fp8_sequence_gather=recipe is not Fp8Recipe.MXFP8,
        library=Fp8Library.TRANSFORMER_ENGINE,
        recipe=recipe,
        library_name=library_name,
        fp8_wgrad=True,
        quantization_reads=reads,
        fp8_param_gather=gather,
        saves_fp8_inputs=True,
        caches_fp8_weights=True,
        devices=devices,
        source=f"{_TE_RECIPES} ({why}); {_TE_MEMORY}",
    )


_MICRO_PIPELINED_SHARE = MappingProxyType({Fp8Recipe.ROWWISE: 0.25, Fp8Recipe.ROWWISE_GW_HP: 0.5, Fp8Recipe.MXFP8: 0.5})
"""``RecipeRun.micro_pipelined_share`` of the torchao recipes that quantize what they gather (tensorwise: 1)."""


def _torchao(
    recipe: Fp8Recipe, library_name: str, *, wgrad: bool, gather: bool, devices: Fp8Devices, why: str
) -> RecipeRun:
    return RecipeRun(
        library=Fp8Library.TORCHAO,
        micro_pipelined_share=_MICRO_PIPELINED_SHARE.get(recipe, 1.0),
        rescaled_backward=recipe is Fp8Recipe.ROWWISE,
        recipe=recipe,
        fp8_sequence_gather=recipe is Fp8Recipe.TENSORWISE,
        library_name=library_name,
        fp8_wgrad=wgrad,
        quantization_reads=2,
        fp8_param_gather=gather,
        saves_fp8_inputs=False,
        caches_fp8_weights=False,
        devices=devices,
        source=f"{_TORCHAO_CONFIG} ({why}); {_TORCHAO_MEMORY}",
    )


RECIPE_RUNS: Mapping[tuple[Fp8Library, Fp8Recipe], RecipeRun] = MappingProxyType(
    {
        (run.library, run.recipe): run
        for run in (
            _te(
                Fp8Recipe.DELAYED,
                "DelayedScaling",
                reads=1,
                gather=True,
                devices=Fp8Devices.FP8,
                why="the cast uses the previous scale and records the amax: 'from two to one' reads",
            ),
            _te(
                Fp8Recipe.TENSORWISE,
                "Float8CurrentScaling",
                reads=2,
                gather=True,
                devices=Fp8Devices.FP8,
                why="an amax pass, then the cast: 'reading the tensor twice'; FP8 all-gather on all architectures",
            ),
            _te(
                Fp8Recipe.BLOCKWISE,
                "Float8BlockScaling",
                reads=2,
                gather=True,
                devices=Fp8Devices.FP8,
                why="rowwise and columnwise each quantized from the bf16 source; block scales need no sync, "
                "so the all-gather is supported",
            ),
            _te(
                Fp8Recipe.MXFP8,
                "MXFP8BlockScaling",
                reads=2,
                gather=False,
                devices=Fp8Devices.MXFP8,
                why="rowwise and columnwise quantized independently; SM 10.0 and 10.3 only; Megatron's MXFP8 "
                "parameter all-gather ships bf16 and requantizes (MoE README: '50% parameter all-gather ... "
                "except MXFP8')",
            ),
            _torchao(
                Fp8Recipe.TENSORWISE,
                "tensorwise",
                wgrad=True,
                gather=True,
                devices=Fp8Devices.FP8,
                why="enable_fsdp_float8_all_gather 'only supports tensorwise scaling granularity'",
            ),
            _torchao(
                Fp8Recipe.ROWWISE,
                "rowwise",
                wgrad=True,
                gather=False,
                devices=Fp8Devices.FP8,
                why="axiswise scales on input, weight and grad_output; communication in high precision",
            ),
            _torchao(
                Fp8Recipe.ROWWISE_GW_HP,
                "rowwise_with_gw_hp",
                wgrad=False,
                gather=False,
                devices=Fp8Devices.FP8,
                why="grad_weight_hp = input_t_hp @ grad_output_hp: the weight gradient in high precision",
            ),
            _torchao(
                Fp8Recipe.MXFP8,
                "mxfp8_cublas",
                wgrad=True,
                gather=False,
                devices=Fp8Devices.MXFP8,
                why="torchtitan mxfp8.md: communication stays in high precision",
            ),
        )
    }
)
"""Every (library, recipe) a library offers; a pair not here is a recipe the library lacks."""


def check_param_gather(run: RecipeRun, *, where: str) -> None:
    """Refuse FP8 parameter all-gather under a recipe that gathers weights in bf16.

    Raises:
        SchemaError: naming the recipe, the library and the fix.
    """
    if not run.fp8_param_gather:
        gathering = ", ".join(
            r.value for (lib, r), other in RECIPE_RUNS.items() if lib is run.library and other.fp8_param_gather
        )
        raise SchemaError(
            f"--fp8-param-gather with fp8 recipe {run.recipe.value!r}: {where}'s {run.library.value} all-gathers "
            f"its weights in bf16 under it; drop --fp8-param-gather, or use {gathering}"
        )


FP8_ALIGNMENT = 16
"""Every dimension of a linear layer an FP8 recipe converts is a multiple of this: torchao's
Float8Linear asserts it, cuBLAS's FP8 GEMMs need it (references-fp8 §4, §5)."""
_BLOCK = MappingProxyType({Fp8Recipe.BLOCKWISE: 128, Fp8Recipe.MXFP8: 32})
"""The block a recipe scales over, which each dimension must fill (TE's blockwise and MXFP8 docs)."""


def converts(run: RecipeRun, in_features: int, out_features: int) -> bool:
    """Whether the library runs a linear layer of weight (``out_features`` x ``in_features``) in
    FP8 under ``run``: its dimensions aligned (``FP8_ALIGNMENT``, the recipe's block), and for
    torchao, not one of the small shapes its ``auto_filter_small_kn`` keeps in bf16 because FP8
    gains nothing there (torchao float8/float8_linear_utils.py, thresholds measured on an H100,
    with N = out_features and K = in_features: tensorwise skips K <= 4096 and N <= 1024; rowwise
    skips N <= 2048, K <= 1024, or N <= 4096 and K <= 2048). The planner's runtime and the
    torchtitan export apply the filter, so the cost model prices what they run. Transformer
    Engine converts every aligned layer."""
    align = max(FP8_ALIGNMENT, _BLOCK.get(run.recipe, 1))
    if in_features % align or out_features % align:
        return False
    if run.library is not Fp8Library.TORCHAO:
        return True
    n, k = out_features, in_features
    if run.recipe is Fp8Recipe.TENSORWISE:
        return not (k <= 4096 and n <= 1024)
    if run.recipe in (Fp8Recipe.ROWWISE, Fp8Recipe.ROWWISE_GW_HP):
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    return True
