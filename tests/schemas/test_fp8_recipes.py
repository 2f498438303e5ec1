"""The FP8 recipe table and each stack's FP8 library: every recipe a stack offers is one its
library runs, the facts that tell the libraries apart hold, and a recipe a stack lacks, or an FP8
parameter gather a recipe cannot do, is refused in one line naming what the stack does offer."""

import pytest
from harness import planner_main

from planner.schemas import STACKS, StackName
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import RECIPE_RUNS, Fp8Devices, Fp8Library, Fp8Recipe, check_param_gather, converts


@pytest.mark.parametrize("name", list(StackName))
def test_every_stack_offers_only_recipes_its_library_runs(name: StackName) -> None:
    stack = STACKS[name]
    assert stack.fp8_source.strip()
    assert (stack.fp8_library is None) == (stack.fp8_recipes == ())
    for recipe in stack.fp8_recipes:
        assert stack.fp8_library is not None
        run = stack.fp8_run(recipe)
        assert (run.library, run.recipe) == (stack.fp8_library, recipe)


def test_the_libraries_differ_where_their_sources_say() -> None:
    te, ao = Fp8Library.TRANSFORMER_ENGINE, Fp8Library.TORCHAO
    # TE saves linear inputs in FP8 and caches FP8 weights; torchao keeps bf16 and casts again.
    assert all(run.saves_fp8_inputs and run.caches_fp8_weights for (lib, _), run in RECIPE_RUNS.items() if lib is te)
    assert not any(run.saves_fp8_inputs or run.caches_fp8_weights for (lib, _), run in RECIPE_RUNS.items() if lib is ao)
    # Delayed scaling reads a tensor once to quantize it, current scaling twice.
    assert RECIPE_RUNS[te, Fp8Recipe.DELAYED].quantization_reads == 1
    assert RECIPE_RUNS[te, Fp8Recipe.TENSORWISE].quantization_reads == 2
    # FP8 weight all-gathers: per-tensor and blockwise in TE, tensorwise alone in torchao, never MXFP8.
    gathers = {key for key, run in RECIPE_RUNS.items() if run.fp8_param_gather}
    assert gathers == {
        (te, Fp8Recipe.DELAYED),
        (te, Fp8Recipe.TENSORWISE),
        (te, Fp8Recipe.BLOCKWISE),
        (ao, Fp8Recipe.TENSORWISE),
    }
    # Only rowwise_with_gw_hp keeps the weight gradient in bf16; only MXFP8 needs Blackwell.
    assert {key for key, run in RECIPE_RUNS.items() if not run.fp8_wgrad} == {(ao, Fp8Recipe.ROWWISE_GW_HP)}
    assert {r for (_, r), run in RECIPE_RUNS.items() if run.devices is Fp8Devices.MXFP8} == {Fp8Recipe.MXFP8}


def test_a_recipe_the_stack_lacks_is_refused_naming_those_it_offers() -> None:
    with pytest.raises(SchemaError, match=r"torchtitan runs FP8 with torchao and offers tensorwise, rowwise, "):
        STACKS[StackName.TORCHTITAN].fp8_run("delayed")
    with pytest.raises(SchemaError, match=r"megatron-lm .* offers delayed, tensorwise, blockwise, mxfp8"):
        STACKS[StackName.MEGATRON_LM].fp8_run(Fp8Recipe.ROWWISE)
    with pytest.raises(SchemaError, match="deepspeed does not train in FP8"):
        STACKS[StackName.DEEPSPEED].fp8_run("tensorwise")
    with pytest.raises(ValueError, match="'fp4'"):
        STACKS[StackName.MEGATRON_LM].fp8_run("fp4")


def test_an_fp8_parameter_gather_is_refused_where_the_recipe_gathers_bf16() -> None:
    check_param_gather(STACKS[StackName.TORCHTITAN].fp8_run("tensorwise"), where="torchtitan")
    with pytest.raises(
        SchemaError, match=r"torchtitan's torchao all-gathers its weights in bf16 under it; .* use tensorwise$"
    ):
        check_param_gather(STACKS[StackName.TORCHTITAN].fp8_run("rowwise"), where="torchtitan")
    with pytest.raises(SchemaError, match=r"use delayed, tensorwise, blockwise$"):
        check_param_gather(STACKS[StackName.MEGATRON_LM].fp8_run("mxfp8"), where="megatron-lm")


def test_planner_stacks_shows_the_fp8_library_and_its_sources_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source naming a config section ([quantize.linear.float8]) is printed, not read as markup."""
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = planner_main(["stacks", "torchtitan"], monkeypatch)
    assert code == 0
    assert "torchao: tensorwise, rowwise, rowwise-gw-hp, mxfp8" in out and "[quantize.linear.float8]" in out


@pytest.mark.parametrize(
    ("library", "recipe", "in_features", "out_features", "expected"),
    [
        # torchao's auto filter, thresholds as its float8_linear_utils.py states them (N out, K in)
        (Fp8Library.TORCHAO, Fp8Recipe.TENSORWISE, 4096, 1024, False),  # K <= 4096 and N <= 1024
        (Fp8Library.TORCHAO, Fp8Recipe.TENSORWISE, 4096, 1040, True),
        (Fp8Library.TORCHAO, Fp8Recipe.TENSORWISE, 4112, 1024, True),
        (Fp8Library.TORCHAO, Fp8Recipe.ROWWISE, 8192, 2048, False),  # N <= 2048
        (Fp8Library.TORCHAO, Fp8Recipe.ROWWISE, 1024, 8192, False),  # K <= 1024
        (Fp8Library.TORCHAO, Fp8Recipe.ROWWISE_GW_HP, 2048, 4096, False),  # N <= 4096 and K <= 2048
        (Fp8Library.TORCHAO, Fp8Recipe.ROWWISE, 2064, 4096, True),
        (Fp8Library.TORCHAO, Fp8Recipe.MXFP8, 64, 64, True),  # no auto filter for MX
        # alignment: 16 for every recipe, the block for blockwise (128) and MXFP8 (32)
        (Fp8Library.TORCHAO, Fp8Recipe.TENSORWISE, 8200, 8192, False),
        (Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.DELAYED, 64, 48, True),
        (Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.DELAYED, 64, 40, False),
        (Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.BLOCKWISE, 4096, 4160, False),
        (Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.BLOCKWISE, 4096, 4224, True),
        (Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.MXFP8, 4096, 4112, False),
    ],
)
def test_which_linear_layers_a_library_converts(
    library: Fp8Library, recipe: Fp8Recipe, in_features: int, out_features: int, expected: bool
) -> None:
    assert converts(RECIPE_RUNS[library, recipe], in_features, out_features) is expected
