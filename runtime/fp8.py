"""FP8 training of a model chunk's transformer layers, with torchao's float8 (``Float8Linear``), and
MXFP8 with torchao's MXFP8 training weights (``_convert_to_mxfp8``; emulated on a CPU).

Which linear layers run in FP8 is decided once, by ``planner.schemas.fp8.converts`` (the shapes a
recipe aligns and torchao's small-shape filter), so the run converts exactly the layers the cost
model prices in FP8. Only the transformer layers' projections are candidates: attention's, the
MLP's, every routed expert's (each an ``nn.Linear`` here, ``runtime.mlp.MoE``) and the shared
experts'. The embeddings, the output layer, the routers and the shared experts' sigmoid gates
stay in the training precision, as every FP8 recipe keeps them (``planner.schemas.fp8``).

torchao's ``Float8Linear`` keeps its weight in the training precision and saves its bf16 input
and weight for the backward, casting them to FP8 again there; so the optimizer, FSDP and the
checkpoints see the same parameters, under the same names, as without FP8. Its MXFP8 weights do
the same (``mx_mm`` saves the bf16 input and weight).
"""

import dataclasses
import importlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

from torch import nn

from planner.schemas.errors import MissingExtraError
from planner.schemas.fp8 import Fp8Library, Fp8Recipe, RecipeRun, converts
from planner.schemas.runtime_support import MX_TOKEN_BLOCK
from runtime.mlp import MLP

logger = logging.getLogger(__name__)

FP8_EXTRA = "planner[fp8]"
"""The extra that brings torchao, in the range the runtime supports (pyproject.toml)."""

KEPT_IN_TRAINING_PRECISION = ("router", "sigmoid_gate")
"""Linear layers inside a transformer layer that no recipe converts: an MoE layer's router (its
softmax picks the experts) and a shared expert's h x 1 sigmoid gate."""

_NOISY_ON_IMPORT = ("torchao", "torch.utils._pytree")
"""Loggers that warn on torchao's import about kernels this run does not use (its CUDA and MX
extension libraries, an enum registration): kept out of the run's output."""


def fp8_candidates(chunk: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """The linear layers of ``chunk``'s transformer layers (its ``layers`` ModuleDict) that an FP8
    recipe may convert, by name in the chunk (``layers.0.mlp.up``)."""
    layers = getattr(chunk, "layers", None)
    if not isinstance(layers, nn.Module):
        return
    for name, module in layers.named_modules(prefix="layers"):
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] not in KEPT_IN_TRAINING_PRECISION:
            yield name, module


def fp8_layer_names(chunk: nn.Module, run: RecipeRun, kept: frozenset[int] = frozenset()) -> tuple[str, ...]:
    """The linear layers of ``chunk`` that ``run`` converts to FP8 (``fp8_candidates`` that
    ``schemas.fp8.converts`` accepts), by name in the chunk, but for those of the transformer
    layers ``kept`` in the training precision (``TrainingSpec.fp8_bf16_layers``: the chunk's
    layers are keyed by their index in the model)."""
    return tuple(
        name
        for name, m in fp8_candidates(chunk)
        if int(name.split(".")[1]) not in kept and converts(run, m.in_features, m.out_features)
    )


def edge_layers(total: int, edge: int) -> frozenset[int]:
    """The indices of a model's first ``edge`` and last ``edge`` of its ``total`` layers."""
    return frozenset((*range(min(edge, total)), *range(max(total - edge, 0), total)))


def convert_to_fp8(
    chunk: nn.Module, run: RecipeRun, *, param_gather: bool = False, kept: frozenset[int] = frozenset()
) -> tuple[str, ...]:
    """Swap ``chunk``'s linear layers that ``run`` converts (``fp8_layer_names``) for torchao's
    ``Float8Linear``, in place; before FSDP shards the chunk (its FP8 all-gather, with
    ``param_gather``, wraps the weights FSDP then shards).

    Args:
        chunk: a model chunk (``runtime.model.Decoder``), built, not yet sharded.
        run: the recipe and library the plan trains with (``TrainingSpec.precision.fp8``).
        param_gather: all-gather the weights in FP8 under ZeRO-3 (torchao's
            ``enable_fsdp_float8_all_gather``, tensorwise only: ``schemas.fp8.check_param_gather``).
        kept: the transformer layers (by index in the model) kept in the training precision
            (``edge_layers`` of ``TrainingSpec.fp8_bf16_layers``).

    Returns:
        The names of the converted layers in ``chunk``.

    Raises:
        MissingExtraError: torchao is not installed; the message names the extra.
    """
    if run.library is not Fp8Library.TORCHAO:
        raise ValueError(f"the runtime trains FP8 with torchao, not {run.library.value}")
    names = fp8_layer_names(chunk, run, kept)
    wanted = set(names)  # torchao's filter sees the same names: each module's path in the chunk
    if run.recipe is Fp8Recipe.MXFP8:
        _convert_to_mxfp8(chunk, wanted)
    else:
        float8 = torchao_float8()
        config = float8.Float8LinearConfig.from_recipe_name(run.library_name)
        if param_gather:
            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
        float8.convert_to_float8_training(chunk, config=config, module_filter_fn=lambda _, fqn: fqn in wanted)
    logger.info(
        "%d linear layer(s) of this chunk train in FP8 (torchao %s), %d in the training precision",
        len(names),
        run.library_name,
        sum(1 for _ in fp8_candidates(chunk)) - len(names),
    )
    return names


def _convert_to_mxfp8(chunk: nn.Module, wanted: set[str]) -> None:
    """Swap the weights of ``chunk``'s linear layers named in ``wanted`` for torchao's MXFP8
    training weights (``MXFP8TrainingOpConfig``: each matmul quantizes its operands in 1x32 blocks
    with power-of-two scales, rounded up, forward and backward, the weight gradient included), in
    place. On CUDA its Blackwell kernels (``schemas.runtime_support.check_fp8_device`` refuses the
    plan below compute capability 10.0); elsewhere its emulation (the same quantization, then a
    matmul of the dequantized operands), so a CPU run trains with MXFP8's numerics. The module
    keeps its class and its parameters their names: the optimizer, FSDP and the checkpoints see
    them as without MXFP8. Each converted MLP pads its rows to whole 32-token blocks
    (``MLP.row_block``): a routed expert sees however many tokens route to it.

    Raises:
        MissingExtraError: torchao is not installed; the message names the extra.
    """
    moe_training = _torchao("torchao.prototype.moe_training.config")
    quantization = _torchao("torchao.quantization")
    recipes = moe_training.MXFP8TrainingRecipe
    on_cuda = any(p.device.type == "cuda" for p in chunk.parameters())
    recipe = recipes.MXFP8_RCEIL if on_cuda else recipes.MXFP8_EMULATED_RCEIL
    config = moe_training.MXFP8TrainingOpConfig.from_recipe(recipe)
    quantization.quantize_(chunk, config, filter_fn=lambda _, fqn: fqn in wanted)
    for name, module in chunk.named_modules():  # a routed expert's rows, padded to whole blocks
        if isinstance(module, MLP) and any(f"{name}.{part}" in wanted for part in ("gate", "up", "down")):
            module.row_block = MX_TOKEN_BLOCK


def precompute_fp8_scales(chunks: Sequence[nn.Module]) -> None:
    """Compute the FP8 scales of every weight FSDP all-gathers in FP8, in one all-reduce: after each
    optimizer step, as torchao asks of ``enable_fsdp_float8_all_gather`` (else each weight's
    gather computes its own amax, one all-reduce a weight)."""
    float8 = torchao_float8()
    for chunk in chunks:
        float8.precompute_float8_dynamic_scale_for_fsdp(chunk)


def torchao_float8() -> ModuleType:
    """torchao's float8 training package (``_torchao``).

    Raises:
        MissingExtraError: torchao is not installed.
    """
    return _torchao("torchao.float8")


def _torchao(name: str) -> ModuleType:
    """torchao's module ``name``, imported without its warnings about CUDA kernels.

    Raises:
        MissingExtraError: torchao is not installed.
    """
    with _quiet(_NOISY_ON_IMPORT):
        try:  # by name: torchao ships no type information, and may be absent
            return importlib.import_module(name)
        except ImportError as e:
            raise MissingExtraError(f"FP8 training needs torchao: pip install '{FP8_EXTRA}'") from e


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Loggers ``names`` report errors only, inside."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
