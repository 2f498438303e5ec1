"""Every field a plan's layout holds has its option on `planner estimate`, so any plan a search
returns can be priced again by hand, field by field: for the top plans of searches that choose
HSDP, hpZ and a device map (Frontier's uneven links), an uneven layer split (a cluster of A100 and
H100 nodes), a vocabulary split with context parallelism, and experts placed from a routing trace,
`estimate` given every field explicitly (no --plan) prices each plan exactly as the search did.
Each new option also overrides its field of --plan, and a bad placement or map file is refused
with one line that names the option and the file."""

import json
from collections.abc import Iterator
from dataclasses import dataclass, fields
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import planner_main
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.cli.options import LAYOUT_OPTIONS, TRAINING_OPTIONS
from planner.files.routing_trace import write_trace
from planner.schemas import Layout, Plan, Recompute, TrainingSpec
from planner.schemas.settings import SearchSettings

TOP_K = 3


def _skewed_trace(path: Path) -> Path:
    """A tiny-moe routing trace (4 MoE layers, 4 experts, top-2) whose expert 0 is the hottest."""
    rng = np.random.default_rng(0)
    picks = [rng.choice(4, size=2, replace=False, p=[0.55, 0.25, 0.12, 0.08]) for _ in range(64 * 4)]
    write_trace(path, np.stack(picks).reshape(64, 4, 2), 4, "tiny-moe")
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A search whose top plans are priced again by hand."""

    model: str
    cluster: str
    training: TrainingSpec
    constraints: dict[str, list[Any]] | None = None
    traced: bool = False
    """Searched on the skewed routing trace, with one replica slot per rank: experts are placed."""

    def settings(self, trace: Path) -> SearchSettings:
        if not self.traced:
            return SearchSettings(top_k=TOP_K, constraints=self.constraints)
        return SearchSettings(top_k=TOP_K, constraints=self.constraints, routing_trace=trace, expert_replicas=1)


SMALL = TrainingSpec(global_batch_size=64, seq_len=128)
LARGE = TrainingSpec(global_batch_size=256, seq_len=4096)
CASES = {
    "frontier: hsdp, hpz, device map": Case(model="tiny-gpt", cluster="frontier-mi250x:2", training=SMALL),
    "mixed devices: layer split": Case(
        model="llama3-8b",
        cluster="dgx-a100-80g:2+dgx-h100:2",
        training=LARGE,
        constraints={"tp": [1], "micro_batch_size": [2], "zero_stage": [1], "recompute": ["none"], "cp": [1]},
    ),
    "llama3-70b: vocabulary split": Case(
        model="llama3-70b", cluster="dgx-h100:4", training=LARGE, constraints={"recompute": ["none"]}
    ),
    "llama3-70b: per-stage recompute, cp": Case(
        model="llama3-70b", cluster="dgx-h100:4", training=LARGE, constraints={"zero_stage": [0, 1]}
    ),
    "tiny-moe: placed experts with replicas": Case(
        model="tiny-moe", cluster="dgx-h100:2", training=SMALL, constraints={"ep": [2, 4]}, traced=True
    ),
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _skewed_trace(tmp_path_factory.mktemp("trace") / "routing.npz")


@pytest.fixture(scope="module")
def searched(trace: Path) -> dict[str, tuple[Plan, ...]]:
    """The top plans of every case's search."""
    return {name: api.search(c.model, c.cluster, c.training, c.settings(trace)) for name, c in CASES.items()}


def _flag(param: str) -> str:
    return "--" + param.replace("_", "-")


def _option(param: str, value: Any) -> list[str]:
    """The command-line words that give ``value`` to option parameter ``param``."""
    if isinstance(value, bool):
        return [_flag(param) if value else "--no-" + param.replace("_", "-")]
    if isinstance(value, IntEnum):
        return [_flag(param), str(int(value))]
    if isinstance(value, StrEnum):
        return [_flag(param), value.value]
    if isinstance(value, tuple):
        return [_flag(param), ",".join(str(v) for v in value)]
    return [_flag(param), str(value)]


def layout_args(plan: Plan, folder: Path) -> Iterator[str]:
    """estimate's options for every field of the plan's layout, defaults spelled out too; the
    expert placement and the device map written to files as a plan file holds them."""
    layout, stored = plan.layout, json.loads(plan.model_dump_json())["layout"]
    for param, field in LAYOUT_OPTIONS.items():
        value = getattr(layout, field)
        if field == "recompute_modules" and layout.recompute is not Recompute.SELECTIVE:
            continue  # the modules selective recompute re-runs; stored as the default otherwise
        if field == "recompute_layers" and value is None:
            continue  # every layer as recompute says: the option's default (it implies full recompute)
        if field in ("expert_placement", "device_map"):
            default = {"expert_placement": "contiguous", "device_map": "identity"}[field]
            if stored[field] is None or stored[field] == {"devices": []}:
                value = default
            else:
                value = folder / f"{field}.json"
                value.write_text(json.dumps(stored[field]))
        elif value is None:
            value = {
                "expert_tensor_parallel_degree": layout.tensor_parallel_degree,
                "sharding_group_size": layout.dense_replicas,
                "secondary_partition_size": 0,
                "layer_split": "even",
            }[field]
        yield from _option(param, value)


def training_args(training: TrainingSpec) -> Iterator[str]:
    for param, field in TRAINING_OPTIONS.items():
        value = getattr(training, field)
        if value is not None:
            yield from _option(param, value)


def test_every_layout_field_has_an_estimate_option() -> None:
    assert sorted(LAYOUT_OPTIONS.values()) == sorted(f.name for f in fields(Layout))


@pytest.mark.slow  # the searches: seconds
def test_the_searches_choose_every_field_the_new_options_set(searched: dict[str, tuple[Plan, ...]]) -> None:
    """Not a vacuous round trip: some plan holds each field away from its default."""
    layouts = [p.layout for plans in searched.values() for p in plans]
    assert any(layout.sharding_group_size is not None for layout in layouts)
    assert any(layout.secondary_partition_size is not None for layout in layouts)
    assert any(layout.expert_placement is not None for layout in layouts)
    assert any(not layout.device_map.is_identity for layout in layouts)
    assert any(layout.layer_split is not None for layout in layouts)
    assert any(layout.vocabulary_layout.over_pipeline for layout in layouts)
    assert any(layout.context_parallel_degree > 1 for layout in layouts)
    assert any(layout.recompute_layers is not None for layout in layouts)


@pytest.mark.slow  # the searches: seconds
@pytest.mark.parametrize("case", list(CASES))
def test_estimate_given_every_field_prices_each_searched_plan_as_the_search_did(
    case: str, searched: dict[str, tuple[Plan, ...]], trace: Path, tmp_path: Path
) -> None:
    model, cluster = CASES[case].model, CASES[case].cluster
    routing = ["--routing-trace", str(trace)] if CASES[case].traced else []
    for rank, plan in enumerate(searched[case]):
        folder = tmp_path / str(rank)
        folder.mkdir()
        args = ["estimate", "-m", model, "-c", cluster, *training_args(plan.training)]
        args += [*layout_args(plan, folder), *routing, "--format", "json", "--output", str(folder / "plan.json")]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output, result.exception)
        got = json.loads(result.stdout)
        assert got["step_time_s"] == plan.estimate.step_time_s, (case, rank, plan.layout.describe())
        assert got["peak_memory_bytes"] == plan.estimate.peak_memory_bytes, (case, rank, plan.layout.describe())
        assert got == json.loads(json.dumps(plan.estimate.to_json_dict()))
        assert api.load_plan(folder / "plan.json").layout == plan.layout  # every field reached the layout


def _hsdp_plan(tmp_path: Path, searched: dict[str, tuple[Plan, ...]]) -> tuple[Plan, Path]:
    """The Frontier search's plan with HSDP, hpZ and a device map, saved."""
    plan = next(p for p in searched["frontier: hsdp, hpz, device map"] if p.layout.secondary_partition_size)
    path = tmp_path / "plan.json"
    api.save_plan(plan, path)
    return plan, path


def _estimated_layout(args: list[str], tmp_path: Path) -> Layout:
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["estimate", *args, "--output", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    return api.load_plan(out).layout


@pytest.mark.slow  # the searches: seconds
def test_each_new_option_overrides_its_field_of_the_plan(searched: dict[str, tuple[Plan, ...]], tmp_path: Path) -> None:
    plan, path = _hsdp_plan(tmp_path, searched)
    layout = plan.layout
    assert layout.zero_stage == 3 and not layout.device_map.is_identity and layout.sharding_group_size is None
    # The defaults spelled out take the plan's choices back.
    plain = _estimated_layout(
        ["--plan", str(path), "--secondary-partition-size", "0", "--device-map", "identity"], tmp_path
    )
    assert plain.secondary_partition_size is None and plain.device_map.is_identity
    assert plain.zero_stage == layout.zero_stage and plain.micro_batch_size == layout.micro_batch_size
    # A sharding group of half the data-parallel ranks, the other plan's map read from its plan file.
    half = layout.dense_replicas // 2
    hsdp = _estimated_layout(
        ["--plan", str(path), "--sharding-group-size", str(half), "--secondary-partition-size", "0"], tmp_path
    )
    assert hsdp.sharding_group_size == half and hsdp.device_map == layout.device_map
    remapped = _estimated_layout(
        ["--plan", str(path), "--device-map", str(path), "--secondary-partition-size", "0"], tmp_path
    )
    assert remapped.device_map == layout.device_map


@pytest.mark.slow  # the searches: seconds
def test_expert_placement_overrides_the_plan_and_is_read_from_a_plan_file(
    searched: dict[str, tuple[Plan, ...]], tmp_path: Path
) -> None:
    placed = searched["tiny-moe: placed experts with replicas"][0]
    assert placed.layout.expert_placement is not None
    path = tmp_path / "placed.json"
    api.save_plan(placed, path)
    contiguous = _estimated_layout(["--plan", str(path), "--expert-placement", "contiguous"], tmp_path)
    assert contiguous.expert_placement is None
    again = _estimated_layout(["--plan", str(path), "--expert-placement", str(path)], tmp_path)
    assert again.expert_placement == placed.layout.expert_placement


BASE = ["estimate", "-m", "tiny-moe", "-c", "dgx-h100:2", "--global-batch-size", "64", "--seq-len", "128"]


@pytest.mark.parametrize(
    ("option", "content", "needle"),
    [
        ("--expert-placement", None, 'placement.json does not exist; give a JSON file holding {"slots"'),
        ("--expert-placement", "{not json", "placement.json: malformed JSON at line 1"),
        (
            "--expert-placement",
            '{"devices": [0]}',
            "found keys ['devices']; give a JSON object with the one key 'slots'",
        ),
        ("--expert-placement", '{"slots": 3}', "slots must hold per MoE layer, per expert-parallel rank, a list"),
        ("--expert-placement", '{"slots": [[[0, 1], [1, 3]]]}', "hosts no copy of experts [2]"),
        ("--expert-placement", '{"slots": [[[0, 1], [2, 3]]]}', "expert_placement places experts on 2 ranks, but "),
        ("--device-map", '{"devices": "0"}', "devices must be a list of whole device numbers"),
        ("--device-map", '{"devices": [0, 0]}', "must name every device 0..1 exactly once"),
        ("--device-map", '{"devices": [1, 0]}', "device_map names 2 devices, but the layout has 16 ranks"),
    ],
)
def test_a_bad_placement_or_map_file_exits_2_in_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, content: str | None, needle: str
) -> None:
    path = tmp_path / ("placement.json" if option == "--expert-placement" else "map.json")
    if content is not None:
        path.write_text(content)
    args = [*BASE, "--dp", "16", "--ep", "4", option, str(path)]
    code, out, err = planner_main(args, monkeypatch)
    assert code == 2, err
    assert err.startswith(f"error: {option} {path}") and needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and out == "", err


def test_a_placement_of_another_models_experts_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"slots": [[[0, 1], [2, 3]]] * 3}))  # 3 MoE layers; tiny-moe has 4
    code, _, err = planner_main([*BASE, "--dp", "16", "--ep", "2", "--expert-placement", str(path)], monkeypatch)
    assert code == 2 and err.startswith(f"error: --expert-placement {path}: expert_placement places 4 experts in 3"), (
        err
    )
