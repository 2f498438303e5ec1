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


def test_torchtitan_converts_the_experts_with_the_grouped_converter_of_the_same_kind() -> None:
    """A plan that priced the routed experts in FP8 (``--fp8-experts``) turns on 0.2.2's grouped-GEMM
    converter of the linear one's kind, over the modules named 'experts'; without it the experts
    stay bf16, as torchtitan's default runs them."""
    moe = layout(16, zero_stage=2, expert_parallel_degree=4)
    grouped = api.export(plan("tiny-moe", moe, stack="torchtitan", fp8="rowwise", fp8_experts=True), "torchtitan")
    assert 'converters = ["quantize.linear.float8", "quantize.grouped_mm.float8"]' in grouped
    assert '[quantize.grouped_mm.float8]\nfqns = ["experts"]' in grouped
    mx = api.export(
        plan("tiny-moe", moe, blackwell=True, stack="torchtitan", fp8="mxfp8", fp8_experts=True), "torchtitan"
    )
    assert 'converters = ["quantize.linear.mx", "quantize.grouped_mm.mx"]' in mx
    assert '[quantize.grouped_mm.mx]\nrecipe_name = "mxfp8"\nfqns = ["experts"]' in mx
    plain = api.export(plan("tiny-moe", moe, stack="torchtitan", fp8="rowwise"), "torchtitan")
    assert "grouped_mm" not in plain and 'converters = ["quantize.linear.float8"]' in plain


def test_torchtitan_refuses_float8_experts_beside_a_pipeline() -> None:
    piped = plan("tiny-moe", layout(8, pp=2, zero_stage=2, expert_parallel_degree=4), stack="torchtitan",
                 fp8="rowwise", fp8_experts=True)  # fmt: skip
    with pytest.raises(InfeasibleConfigError, match=r"without pipeline and context parallelism; plan with --no-fp8"):
        api.export(piped, "torchtitan")
