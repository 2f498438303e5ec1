"""search --stack X keeps only the layouts X runs or expresses: the best plan of a search for a
stack with an export exports, and the planner's runtime's best plan launches, on the first try."""

from pathlib import Path

import pytest
from harness import planner_main

from planner import api
from planner.export.targets import STACK_CHECKS
from planner.flows.search import admission
from planner.schemas import Layout, PositionEmbedding, StackName, TrainingSpec
from planner.schemas.cluster import DeviceKind
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_runnable
from planner.schemas.settings import SearchSettings

RUNS = {
    "torchtitan": ("export", "--to", "torchtitan"),
    "megatron-lm": ("export", "--to", "megatron"),
    "deepspeed": ("export", "--to", "deepspeed"),
    "planner-runtime": ("launch", "--master-addr", "10.0.0.1"),
}


@pytest.mark.slow
@pytest.mark.parametrize("stack", sorted(RUNS))
def test_every_plan_a_stacks_search_returns_runs_there(
    stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the stack's checks the top torchtitan plan was ZeRO-1 or tp without sequence
    parallelism, which its export refuses."""
    plans = api.search(
        "llama3-70b",
        "dgx-h100:4",
        TrainingSpec(global_batch_size=256, seq_len=8192, stack=stack),
        SearchSettings(top_k=3),
    )
    command = RUNS[stack]
    for i, plan in enumerate(plans):
        path = tmp_path / f"plan-{i}.json"
        api.save_plan(plan, path)
        code, _, err = planner_main([command[0], str(path), *command[1:]], monkeypatch)
        assert code == 0, f"{plan.layout.describe()}: {err}"


def test_each_stack_with_an_export_or_a_runtime_has_its_check() -> None:
    model, cluster = api.load_model("tiny-gpt"), api.load_cluster("dgx-h100:2")
    for stack in StackName:
        admit = admission(model, TrainingSpec(global_batch_size=16, seq_len=128, stack=stack), cluster)
        checked = stack in STACK_CHECKS or stack is StackName.PLANNER_RUNTIME
        assert (admit is not None) is checked, stack


def test_the_search_leaves_out_what_the_stack_refuses_and_counts_it() -> None:
    """torchtitan has no ZeRO-1: a search narrowed to ZeRO-1 finds nothing it runs and says why."""
    training = TrainingSpec(global_batch_size=16, seq_len=128, stack="torchtitan")
    settings = SearchSettings(top_k=1, constraints={"zero_stage": (1,), "tp": (1,), "pp": (1,)})
    with pytest.raises(
        InfeasibleConfigError, match=r"that torchtitan runs .*refused, e\.g\. torchtitan cannot express ZeRO-1"
    ):
        api.search("tiny-gpt", "dgx-h100:2", training, settings)
    runtime = api.search("tiny-gpt", "dgx-h100:2", training.under("planner-runtime"), settings)
    assert runtime[0].layout.zero_stage == 1  # the planner's runtime runs it


def test_the_runtimes_check_is_the_one_launch_applies() -> None:
    """A search for planner-runtime asks of each layout what `planner run` asks of the plan, on the
    cluster's kind of device: tensor-parallel overlap is refused on GPUs only."""
    model = api.load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=16, seq_len=128, tp_comm_overlap=True)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        sequence_parallel=True,
    )
    gpus = api.load_cluster("dgx-h100:2")
    assert gpus.pricing_device.kind is DeviceKind.CUDA
    admit = admission(model, training, gpus)
    assert admit is not None
    with pytest.raises(InfeasibleConfigError, match="tp_comm_overlap"):
        admit(layout)
    with pytest.raises(InfeasibleConfigError, match="tp_comm_overlap"):
        check_runnable(PlannedLayout(model, training, layout), cuda=True)


def test_a_model_the_runtime_cannot_build_is_refused_by_its_search_and_planned_for_another_stack() -> None:
    alibi = api.load_model("tiny-gpt").model_copy(update={"position_embedding_type": PositionEmbedding.ALIBI})
    training = TrainingSpec(global_batch_size=16, seq_len=128)
    with pytest.raises(InfeasibleConfigError, match=r"ALiBi .* which this runtime does not build.*search with --stack"):
        api.search(alibi, "dgx-h100:1", training, SearchSettings(top_k=1))
    assert api.search(alibi, "dgx-h100:1", training.under("megatron-lm"), SearchSettings(top_k=1))


def test_a_search_for_the_runtime_refuses_a_model_it_does_not_build_before_searching() -> None:
    """A gated shared expert beside MLP biases: the runtime would train another model, so its
    search stops at once and names another stack; planned for megatron-lm, it searches.
    DeepSeek-V3's latent attention the runtime builds: its layouts are weighed."""
    training = TrainingSpec(global_batch_size=512, seq_len=4096)
    cluster = api.load_cluster("dgx-h100:32")
    gated = api.load_model("deepseek-v3").model_copy(
        update={"shared_expert_intermediate_size": 2048, "n_shared_experts": None, "mlp_bias": True}
    )
    with pytest.raises(InfeasibleConfigError, match=r"gated shared expert.*--stack megatron-lm"):
        admission(gated, training, cluster)
    assert admission(gated, training.under("megatron-lm"), cluster)
    assert admission(api.load_model("deepseek-v3"), training, cluster)
