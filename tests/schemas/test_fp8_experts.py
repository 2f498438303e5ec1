"""``TrainingSpec.fp8_experts``: whether an MoE model's routed experts run under the FP8 recipe too.
None follows the stack (``Stack.fp8_experts``); a stack whose default is off can turn them on
under the recipes its grouped-GEMM converters run (torchtitan: rowwise, mxfp8); a stack that
always converts them cannot keep them apart. Priced: the experts' GEMMs at the FP8 rate."""

import pytest

from cost_models.estimate import estimate
from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.settings import SearchSettings

MIXTRAL = load_model("mixtral-8x7b")
H100 = load_cluster("dgx-h100:8")
EP8 = Layout(
    data_parallel_degree=64,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    expert_parallel_degree=8,
    zero_stage=2,
    recompute="full",
)


def _training(**kw: object) -> TrainingSpec:
    return TrainingSpec.model_validate({"global_batch_size": 256, "seq_len": 4096, **kw})


def test_none_follows_the_stack_and_torchtitan_turns_its_experts_on_under_rowwise_and_mxfp8() -> None:
    assert _training(stack="megatron-lm", fp8="tensorwise").precision.fp8_experts  # TE's grouped linear layers
    assert not _training(stack="torchtitan", fp8="rowwise").precision.fp8_experts  # its default converter
    assert _training(stack="torchtitan", fp8="rowwise", fp8_experts=True).precision.fp8_experts
    assert _training(stack="torchtitan", fp8="mxfp8", fp8_experts=True).precision.fp8_experts
    assert _training(stack="megatron-lm", fp8="tensorwise", fp8_experts=True).fp8_experts  # its default: allowed


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"stack": "torchtitan", "fp8": "tensorwise", "fp8_experts": True}, r"under rowwise, mxfp8 only"),
        ({"stack": "nemo-automodel", "fp8": "rowwise", "fp8_experts": True}, r"keeps the routed experts in bf16"),
        ({"stack": "megatron-lm", "fp8": "tensorwise", "fp8_experts": False}, r"cannot keep them apart"),
        ({"stack": "torchtitan", "fp8_experts": True}, r"no --fp8 recipe is given"),
    ],
)
def test_what_a_stack_cannot_run_is_refused_with_its_fix(fields: dict[str, object], says: str) -> None:
    with pytest.raises(SchemaError, match=says):
        _training(**fields)


def test_experts_in_fp8_price_only_their_gemms_faster() -> None:
    bf16_experts = estimate(MIXTRAL, _training(stack="torchtitan", fp8="rowwise"), H100, EP8)
    fp8_experts = estimate(MIXTRAL, _training(stack="torchtitan", fp8="rowwise", fp8_experts=True), H100, EP8)
    assert fp8_experts.step_time_s < bf16_experts.step_time_s
    # Mixtral's experts hold most of its FLOPs: the gain is more than a few percent
    assert bf16_experts.step_time_s / fp8_experts.step_time_s > 1.05
    assert fp8_experts.time.compute_s < bf16_experts.time.compute_s
    # the tokens go to the experts and back in bf16 either way
    assert fp8_experts.time.expert_parallel_comm_s == bf16_experts.time.expert_parallel_comm_s


def test_a_search_over_recipes_turns_the_experts_on_where_the_stack_can() -> None:
    training = TrainingSpec(global_batch_size=256, seq_len=4096, stack="torchtitan")
    settings = SearchSettings(top_k=4, constraints={"tp": (1,), "pp": (1,)})
    _, plans = api.search_recipes(MIXTRAL, H100, training, [None, "rowwise"], settings, experts=True)
    assert {(p.training.fp8, p.training.fp8_experts) for p in plans} <= {(None, None), ("rowwise", True)}
    assert any(p.training.fp8_experts for p in plans)
    with pytest.raises(SchemaError, match=r"under rowwise, mxfp8 only"):
        api.search_recipes(MIXTRAL, H100, training, ["tensorwise"], settings, experts=True)
