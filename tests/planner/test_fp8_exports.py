"""FP8 plans exported: each target's flags for the recipe the plan priced, and one-line refusals
where the target cannot run it (the frameworks' own config code reads the exports in
test_exports_frameworks.py)."""

import shlex

import pytest
from export_plans import layout, plan

from planner import api
from planner.schemas.errors import InfeasibleConfigError, SchemaError


def test_megatron_gets_format_recipe_gather_and_router_padding() -> None:
    words = shlex.split(api.export(plan("tiny-moe", layout(16, zero_stage=1), stack="megatron-lm", fp8="blockwise",
                                        fp8_param_gather=True), "megatron"))  # fmt: skip
    flags = " ".join(words)
    assert "--fp8-format e4m3 --fp8-recipe blockwise --fp8-param-gather --moe-router-padding-for-fp8" in flags
    dense = " ".join(
        shlex.split(api.export(plan("tiny-gpt", layout(16), stack="megatron-lm", fp8="delayed"), "megatron"))
    )
    assert "--fp8-format hybrid --fp8-recipe delayed" in dense and "--fp8-param-gather" not in dense
    assert "--fp8" not in " ".join(
        shlex.split(api.export(plan("tiny-gpt", layout(16), stack="megatron-lm"), "megatron"))
    )


def test_torchtitan_gets_its_converter_and_filters() -> None:
    toml = api.export(plan("llama3-8b", layout(16, zero_stage=3), stack="torchtitan", fp8="rowwise"), "torchtitan")
    assert 'converters = ["quantize.linear.float8"]' in toml
    assert '[quantize.linear.float8]\nfilter_fqns = ["output", "auto_filter_small_kn"]\nrecipe_name = "rowwise"' in toml


@pytest.mark.parametrize(
    ("target", "stack", "fp8", "zero", "says"),
    [
        ("megatron", "megatron-lm", {"fp8": "tensorwise", "fp8_param_gather": True}, 0, "distributed optimizer"),
        ("torchtitan", "torchtitan", {"fp8": "tensorwise", "fp8_param_gather": True}, 0, "no FSDP runs"),
        ("deepspeed", "megatron-lm", {"fp8": "tensorwise"}, 1, "deepspeed does not train in FP8"),
        ("torchtitan", "megatron-lm", {"fp8": "delayed"}, 3, "offers tensorwise, rowwise"),
    ],
)
def test_what_a_target_cannot_run_is_refused(
    target: str, stack: str, fp8: dict[str, object], zero: int, says: str
) -> None:
    exported = plan("tiny-gpt", layout(16, zero_stage=zero), stack=stack, **fp8)
    with pytest.raises((InfeasibleConfigError, SchemaError), match=says):
        api.export(exported, target)


def test_megatron_refuses_delayed_scaling_with_layernorm_recompute() -> None:
    exported = plan("tiny-gpt", layout(16, recompute="selective", recompute_modules=("layernorm",)),
                    stack="megatron-lm", fp8="delayed")  # fmt: skip
    with pytest.raises(InfeasibleConfigError, match="plan with another --fp8 recipe"):
        api.export(exported, "megatron")


def test_the_first_and_last_layers_kept_in_bf16_are_exported() -> None:
    megatron = plan("tiny-gpt", layout(16), stack="megatron-lm", fp8="tensorwise", fp8_bf16_layers=1)
    words = " ".join(shlex.split(api.export(megatron, "megatron")))
    assert "--first-last-layers-bf16 --num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 1" in words
    titan = plan("llama3-8b", layout(16, zero_stage=3), stack="torchtitan", fp8="tensorwise", fp8_bf16_layers=2)
    assert '"output", "layers.0.", "layers.1.", "layers.30.", "layers.31."' in api.export(titan, "torchtitan")
    delayed = plan("tiny-gpt", layout(16), stack="megatron-lm", fp8="delayed", fp8_bf16_layers=1)
    with pytest.raises(InfeasibleConfigError, match="without --fp8-bf16-layers"):
        api.export(delayed, "megatron")
