"""A model whose layers the runtime does not build as planned (ALiBi, a gated shared expert beside
MLP biases) is refused in one line, exit code 2, by every command that would run it: `planner
run` (each rank, before any rendezvous), its dry run, `planner launch` and `planner tune`;
`planner search` still plans it. DeepSeek's multi-head latent attention is built
(``runtime.latent_attention``) and accepted."""

from dataclasses import replace
from pathlib import Path

import pytest
from harness import planner_main

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.plans import make_plan, save_plan
from planner.schemas import ContextParallelKind, Layout, ModelSpec, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_buildable, check_runnable, unbuilt_features

BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=256,
    hidden_act="silu",
    max_position_embeddings=256,
)
MLA = ModelSpec(
    name="tiny-mla", kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, **BASE
)
UNBUILT = {
    "ALiBi": ModelSpec(name="tiny-alibi", position_embedding_type="alibi", **BASE),
    "gated shared expert with MLP biases": ModelSpec(
        name="tiny-gated-bias",
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=64,
        mlp_bias=True,
        **BASE,
    ),
}
CLUSTER = "dgx-h100:1"
TRAINING = TrainingSpec(global_batch_size=8, seq_len=32)


def _plan(model: ModelSpec, tmp_path: Path) -> Path:
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    cluster = load_cluster(CLUSTER)
    path = tmp_path / "plan.json"
    save_plan(make_plan(model, TRAINING, cluster, CLUSTER, layout, estimate(model, TRAINING, cluster, layout)), path)
    return path


def _refused(code: int, err: str, feature: str) -> None:
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # tune's progress bar aside
    assert code == 2, err
    assert len(errors) == 1 and feature in errors[0] and "does not build" in errors[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("feature", list(UNBUILT))
def test_each_unbuilt_feature_is_named(feature: str) -> None:
    model = UNBUILT[feature]
    assert any(feature in f for f in unbuilt_features(model))
    with pytest.raises(InfeasibleConfigError, match=feature):
        check_buildable(model)


@pytest.mark.parametrize("command", ["run", "dry-run", "launch"])
@pytest.mark.parametrize("feature", list(UNBUILT))
def test_commands_that_run_a_plan_refuse_an_unbuilt_model(
    feature: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = str(_plan(UNBUILT[feature], tmp_path))
    args = {"run": ["run", plan], "dry-run": ["run", plan, "--dry-run"], "launch": ["launch", plan]}[command]
    if command == "run":  # rank 0 of the plan's job under torchrun, with no rendezvous to reach
        for name, value in {"RANK": 0, "WORLD_SIZE": 8, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 8}.items():
            monkeypatch.setenv(name, str(value))
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)
    code, _, err = planner_main(args, monkeypatch)
    _refused(code, err, feature)


@pytest.mark.parametrize("feature", list(UNBUILT))
def test_tune_refuses_an_unbuilt_model_before_searching(
    feature: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model.yaml"
    model.write_text("".join(f"{k}: {v}\n" for k, v in UNBUILT[feature].model_dump(exclude_defaults=True).items()))
    args = ["tune", "-m", str(model), "-c", CLUSTER, "--global-batch-size", "8", "--seq-len", "32"]
    code, _, err = planner_main([*args, "--workdir", str(tmp_path / "tune")], monkeypatch)
    _refused(code, err, feature)


def test_search_still_plans_an_unbuilt_model(tmp_path: Path) -> None:
    assert _plan(UNBUILT["ALiBi"], tmp_path).exists()


@pytest.mark.parametrize("q_lora_rank", [48, None])
def test_multi_head_latent_attention_is_built(q_lora_rank: int | None) -> None:
    model = MLA.model_copy(update={"q_lora_rank": q_lora_rank})
    assert unbuilt_features(model) == ()
    check_buildable(model)


@pytest.mark.parametrize("kind", list(ContextParallelKind))
def test_latent_attention_under_context_parallelism_is_refused_before_a_run(kind: ContextParallelKind) -> None:
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        context_parallel_degree=2,
        context_parallel_kind=kind,
    )
    with pytest.raises(InfeasibleConfigError, match=r"multi-head latent attention under context parallelism.*--cp 1"):
        check_runnable(PlannedLayout(MLA, TRAINING, layout), cuda=False)
    check_runnable(PlannedLayout(MLA, TRAINING, replace(layout, context_parallel_degree=1)), cuda=False)


def test_launch_accepts_a_latent_attention_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = planner_main(["launch", str(_plan(MLA, tmp_path))], monkeypatch)
    assert code == 0, err
    assert "torchrun" in out
