"""Plan files: round trip, a frozen schema, clear errors, and `planner estimate --plan/--output`."""

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models.estimate import estimate
from planner.cli import app
from planner.files.clusters import load_cluster, save_cluster
from planner.files.models import load_model
from planner.files.plans import load_plan, make_plan, save_plan
from planner.schemas import (
    DeviceKind,
    Estimate,
    Layout,
    LossMethod,
    Plan,
    Recompute,
    Schedule,
    SelectiveRecompute,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.errors import PlannerError, SchemaError
from planner.schemas.plan import PLAN_SCHEMA_VERSION, READABLE_VERSIONS

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plan_schema_v19.json"
MODEL = load_model("tiny-gpt")
CLUSTER = load_cluster("dgx-a100-80g:1")
CLUSTER_H100 = load_cluster("dgx-h100:1")  # FP8 tensor cores
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)


def test_plan_schema_is_frozen(update_golden: bool) -> None:
    schema = json.dumps(Plan.model_json_schema(), indent=2, sort_keys=True) + "\n"
    if update_golden:
        GOLDEN.write_text(schema)
    assert GOLDEN.read_text() == schema, (
        "Plan's schema changed: bump schema_version, keep a reader for the old versions (schemas.plan.upgrade), "
        "then run pytest --update-golden"
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    split=st.sampled_from([(1, 1, 8), (2, 2, 2), (1, 2, 4), (4, 2, 1), (8, 1, 1)]),
    micro_batch=st.sampled_from([1, 2, 4]),
    zero=st.sampled_from(list(ZeroStage)),
    recompute=st.sampled_from(list(Recompute)),
    modules=st.sampled_from([("core_attn",), ("layernorm", "mlp"), ("mlp", "core_attn", "layernorm")]),
)
def test_plan_round_trips_through_json(
    tmp_path: Path,
    split: tuple[int, int, int],
    micro_batch: int,
    zero: ZeroStage,
    recompute: Recompute,
    modules: tuple[str, ...],
) -> None:
    d, t, p = split
    layout = Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=micro_batch,
        zero_stage=zero,
        recompute=recompute,
        recompute_modules=modules,  # type: ignore[arg-type]
        sequence_parallel=t > 1,
        schedule=Schedule.INTERLEAVED if p == 2 else Schedule.ONE_F_ONE_B,
        virtual_stages=2 if p == 2 else 1,
    )
    try:
        est = estimate(MODEL, TRAINING, CLUSTER, layout)
    except PlannerError:
        return
    plan = make_plan(MODEL, TRAINING, CLUSTER, "dgx-a100-80g:1", layout, est)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def _plan(tmp_path: Path) -> Path:
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=2)
    plan = make_plan(MODEL, TRAINING, CLUSTER, "dgx-a100-80g:1", layout, estimate(MODEL, TRAINING, CLUSTER, layout))
    save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def test_invalid_plans_name_the_file_and_problem(tmp_path: Path) -> None:
    raw = json.loads(_plan(tmp_path).read_text())
    cases = {
        "version.json": {**raw, "schema_version": 99},
        "layout.json": {**raw, "layout": {**raw["layout"], "tensor_parallel_degree": 0}},
        "extra.json": {**raw, "surprise": 1},
    }
    for name, content in cases.items():
        (tmp_path / name).write_text(json.dumps(content))
        with pytest.raises(SchemaError, match=name):
            load_plan(tmp_path / name)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SchemaError, match="line 1"):
        load_plan(tmp_path / "broken.json")


def test_estimate_from_a_plan_reproduces_its_estimate_and_takes_overrides(tmp_path: Path) -> None:
    path = _plan(tmp_path)
    plan = load_plan(path)
    same = CliRunner().invoke(app, ["estimate", "--plan", str(path), "--format", "json"])
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["step_time_s"] == pytest.approx(plan.estimate.step_time_s)
    changed = CliRunner().invoke(app, ["estimate", "--plan", str(path), "--tp", "1", "--dp", "8", "--format", "json"])
    assert changed.exit_code == 0, changed.output
    expected = estimate(
        MODEL, TRAINING, CLUSTER, replace(plan.layout, tensor_parallel_degree=1, data_parallel_degree=8)
    )
    assert json.loads(changed.output)["step_time_s"] == pytest.approx(expected.step_time_s)


def test_estimate_output_writes_a_plan_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = [
        "estimate",
        "-m",
        "tiny-gpt",
        "-c",
        "dgx-a100-80g:1",
        "--global-batch-size",
        "32",
        "--seq-len",
        "128",
        "--dp",
        "8",
        "--output",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.layout.data_parallel_degree == 8 and plan.cluster.world_size == 8
    assert plan.model == MODEL and plan.training == TRAINING


def test_a_plan_says_its_device_kind(tmp_path: Path) -> None:
    assert load_plan(_plan(tmp_path)).cluster.device_kind is DeviceKind.CUDA


@pytest.mark.parametrize(
    ("device_name", "kind"),
    [("NVIDIA H100 80GB HBM3", DeviceKind.CUDA), ("cpu (Intel(R) Xeon(R) Processor @ 2.20GHz)", DeviceKind.CPU)],
)
def test_a_version_1_plan_takes_its_device_kind_from_its_device_name(
    tmp_path: Path, device_name: str, kind: DeviceKind
) -> None:
    raw = json.loads((GOLDEN.parent / "plan_v1_llama3_70b.json").read_text())
    assert raw["schema_version"] == 1 and "device_kind" not in raw["cluster"]
    raw["cluster"]["device_name"] = device_name
    (tmp_path / "v1.json").write_text(json.dumps(raw))
    plan = load_plan(tmp_path / "v1.json")
    assert (plan.cluster.device_name, plan.cluster.device_kind) == (device_name, kind)


def _measured_plan(profile: Path, spec: str, plan_path: Path) -> None:
    """A plan on the profile at ``profile``, given to the planner as ``spec`` (from the cwd)."""
    profile.parent.mkdir(parents=True, exist_ok=True)
    save_cluster(CLUSTER, profile)
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    plan = make_plan(MODEL, TRAINING, load_cluster(spec), spec, layout, estimate(MODEL, TRAINING, CLUSTER, layout))
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    save_plan(plan, plan_path)


def _opens(plan_path: Path) -> Path:
    """The profile the plan names, loaded as `planner explain` loads it; its path."""
    spec = load_plan(plan_path).cluster.spec
    assert load_cluster(spec) == CLUSTER
    return Path(spec)


def test_a_plan_on_a_measured_cluster_opens_from_any_directory_and_when_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan once stored the profile's path as typed, relative to the working
    # directory (out/cluster.json): from out/ itself, or once out/ was copied, it no longer opened.
    monkeypatch.chdir(tmp_path)
    _measured_plan(Path("out/cluster.json"), "out/cluster.json", Path("out/plan.json"))
    assert json.loads(Path("out/plan.json").read_text())["cluster"]["spec"] == "cluster.json"  # beside the plan
    assert _opens(Path("out/plan.json")) == tmp_path / "out" / "cluster.json"
    monkeypatch.chdir(tmp_path / "out")
    assert _opens(Path("plan.json")) == tmp_path / "out" / "cluster.json"
    monkeypatch.chdir(tmp_path)
    Path("out").rename("moved")  # the folder copied or moved: plan and profile travel together
    assert _opens(Path("moved/plan.json")) == tmp_path / "moved" / "cluster.json"


def test_a_plan_on_a_profile_outside_its_folder_names_it_absolute_and_opens_when_copied_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _measured_plan(Path("profiles/cluster.json"), "profiles/cluster.json", Path("plans/plan.json"))
    stored = json.loads(Path("plans/plan.json").read_text())["cluster"]["spec"]
    assert stored == str(tmp_path / "profiles" / "cluster.json")
    Path("elsewhere").mkdir()
    Path("plans/plan.json").rename("elsewhere/plan.json")  # the plan alone, somewhere else
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _opens(Path("plan.json")) == tmp_path / "profiles" / "cluster.json"


def test_a_plan_written_with_its_profile_relative_to_the_working_directory_still_opens_from_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _measured_plan(Path("out/cluster.json"), "out/cluster.json", Path("out/plan.json"))
    raw = json.loads(Path("out/plan.json").read_text())
    raw["cluster"]["spec"] = "out/cluster.json"  # as plans were written before
    Path("out/plan.json").write_text(json.dumps(raw))
    assert _opens(Path("out/plan.json")) == tmp_path / "out" / "cluster.json"
    preset = make_plan(MODEL, TRAINING, CLUSTER, "dgx-a100-80g:1", *_layout_and_estimate())
    assert preset.cluster.spec == "dgx-a100-80g:1"  # a preset stays a preset


def _layout_and_estimate() -> tuple[Layout, Estimate]:
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    return layout, estimate(MODEL, TRAINING, CLUSTER, layout)


def test_a_planner_file_given_in_another_files_place_is_named(tmp_path: Path) -> None:
    """A model config, cluster profile or plan given where another goes: one line naming both kinds
    and where the file goes, not the wanted file's schema errors key by key."""
    plan = _plan(tmp_path)
    save_cluster(CLUSTER, tmp_path / "cluster.json")
    config = {"hidden_size": 64, "num_hidden_layers": 2, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cases: list[tuple[Callable[[str], object], str, str]] = [
        (load_plan, str(tmp_path / "config.json"), "is a model config, not a plan: give it as --model"),
        (load_plan, str(tmp_path / "cluster.json"), "is a cluster profile, not a plan: give it as --cluster"),
        (load_model, str(plan), "is a plan, not a model config: give it where a plan goes"),
        (load_cluster, str(plan), "is a plan, not a cluster profile"),
        (load_cluster, str(tmp_path / "config.json"), "is a model config, not a cluster profile"),
    ]
    for load, path, said in cases:
        with pytest.raises(SchemaError, match=said) as info:
            load(path)
        assert "\n" not in str(info.value)


def test_the_version_a_plan_is_written_in_is_the_newest_readable() -> None:
    assert Plan.model_fields["schema_version"].default == PLAN_SCHEMA_VERSION == READABLE_VERSIONS[-1]


def test_a_version_17_plan_reads_its_loss_and_selective_recompute_as_priced(tmp_path: Path) -> None:
    # version 17 priced every stack's loss as one fp32 softmax made the gradient in place; under
    # torchtitan, whose compiled loss version 18 prices as fused, it still reads so
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    training = TrainingSpec(global_batch_size=32, seq_len=128, stack="torchtitan")
    assert training.loss_method is LossMethod.FUSED
    plan = make_plan(MODEL, training, CLUSTER, "dgx-a100-80g:1", layout, estimate(MODEL, training, CLUSTER, layout))
    raw = json.loads(plan.model_dump_json())
    del raw["training"]["loss_method"], raw["training"]["selective_recompute"]
    (tmp_path / "v17.json").write_text(json.dumps({**raw, "schema_version": 17}))
    read = load_plan(tmp_path / "v17.json")
    assert read.training.loss_method is LossMethod.FP32_IN_PLACE
    assert read.training.selective_recompute is SelectiveRecompute.MODULES  # torchtitan's is per op
    assert read.training.stack == "torchtitan"


def test_a_version_18_plan_runs_its_experts_as_its_stack_does(tmp_path: Path) -> None:
    moe = load_model("tiny-moe")
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    training = TrainingSpec(global_batch_size=32, seq_len=128, stack="torchtitan", fp8="rowwise")
    plan = make_plan(moe, training, CLUSTER_H100, "dgx-h100:1", layout, estimate(moe, training, CLUSTER_H100, layout))
    raw = json.loads(plan.model_dump_json())
    del raw["training"]["fp8_experts"]
    (tmp_path / "v18.json").write_text(json.dumps({**raw, "schema_version": 18}))
    read = load_plan(tmp_path / "v18.json")
    assert read.training.fp8_experts is None and not read.training.precision.fp8_experts  # torchtitan's default
    assert read.estimate == plan.estimate
