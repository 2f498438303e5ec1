"""Inputs that once ended in a traceback or a hang now end in one line and exit 2,
refused where they are read: output paths and storage before the work, numbers at load (finite,
positive, within the bounds of ``planner.schemas.bounds``)."""

import json
import sys
import time
from pathlib import Path

import pytest

from planner import api
from planner.cli import main
from planner.files.cluster_presets import cluster_preset
from planner.files.clusters import save_cluster
from planner.files.models import load_model
from planner.files.plans import load_plan, make_plan, save_plan
from planner.schemas import Layout, TrainingSpec
from planner.schemas.bounds import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH
from planner.schemas.errors import SchemaError

SEARCH = ["search", "-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"]
ESTIMATE = ["estimate", "-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"]


def cli(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the console script's entry point in-process: its exit code and everything it printed."""
    monkeypatch.setattr(sys, "argv", ["planner", *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    captured = capsys.readouterr()
    code = stopped.value.code
    return (code if isinstance(code, int) else 1), captured.out + captured.err


def refused(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command prints (exit 2, no traceback), within seconds (no hang)."""
    start = time.perf_counter()
    code, output = cli(args, monkeypatch, capsys)
    assert code == 2, output
    assert "Traceback" not in output
    assert time.perf_counter() - start < 10.0
    return output


@pytest.fixture
def no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search that would start fails the test: the check must come before the work."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search ran before its output was checked")

    monkeypatch.setattr(api, "search_outcome", started)


# --- outputs and storage, checked before the work ------------------------------------------------


@pytest.mark.parametrize(
    ("storage", "needle"),
    [
        ("bogus://x", "is not a database URL"),
        ("not a url", "is not a database URL"),
        ("sqlite:///missing/search.db", "the folder 'missing' does not exist"),
        ("sqlite:///.", "is a folder"),
    ],
)
def test_a_bad_storage_is_refused_before_the_search(
    storage: str, needle: str, tmp_path: Path, no_search: None, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    output = refused([*SEARCH, "--strategy", "optuna", "--storage", storage], monkeypatch, capsys)
    assert f"--storage {storage!r}" in output and needle in output
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("command", [SEARCH, [*ESTIMATE, "--dp", "8"]])
@pytest.mark.parametrize(
    ("output", "needle"),
    [("missing/plan.json", "the folder 'missing' does not exist"), (".", "'.' is a folder")],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_work(
    command: list[str], output: str, needle: str, tmp_path: Path, no_search: None, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert needle in refused([*command, "--output", output], monkeypatch, capsys)


def test_saving_a_plan_where_it_cannot_go_is_a_schema_error(tmp_path: Path) -> None:
    model, cluster = load_model("tiny-gpt"), cluster_preset("dgx-a100-80g", 1)
    training, layout = (
        TrainingSpec(global_batch_size=32, seq_len=128),
        Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1),
    )
    plan = make_plan(model, training, cluster, "dgx-a100-80g:1", layout, api.estimate(model, cluster, training, layout))
    with pytest.raises(SchemaError, match="cannot write the plan"):
        save_plan(plan, tmp_path)


# --- files --------------------------------------------------------------------------------------


def test_explain_on_binary_junk_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    junk = tmp_path / "plan.json"
    junk.write_bytes(bytes(range(128, 256)))
    assert "is not a plan file: byte 0 is not UTF-8" in refused(["explain", str(junk)], monkeypatch, capsys)


def _cluster_file(tmp_path: Path, change: dict[str, object], *, explicit_links: bool = False) -> str:
    """The dgx-a100-80g:1 preset as a profile file, one device figure changed (or a link: explicit
    4 x 4 matrices with bandwidth[0][1] and latency[2][3] changed)."""
    path = tmp_path / "cluster.json"
    save_cluster(cluster_preset("dgx-a100-80g", 1), path)
    raw = json.loads(path.read_text())
    if explicit_links:
        rows = [[0.0 if i == j else 1e11 for j in range(8)] for i in range(8)]
        latency = [[0.0 if i == j else 1e-6 for j in range(8)] for i in range(8)]
        rows[0][1] = change.get("bandwidth", rows[0][1])  # type: ignore[assignment]
        latency[2][3] = change.get("latency", latency[2][3])  # type: ignore[assignment]
        raw["intra_node_links"] = {"size": 8, "bandwidth_bytes_per_s": rows, "latency_s": latency}
    else:
        raw["device"]["peak_flop_per_s"].update(change)
    path.write_text(json.dumps(raw))  # NaN and Infinity as JSON writers spell them
    return str(path)


@pytest.mark.parametrize(
    ("bf16", "needle"),
    [
        (0, "peak_flop_per_s.bf16=0.0 must be > 0"),
        (-1e12, "peak_flop_per_s.bf16=-1000000000000.0 must be > 0"),
        (float("nan"), "peak_flop_per_s.bf16=nan: Input should be a finite number"),
        (float("inf"), "peak_flop_per_s.bf16=inf: Input should be a finite number"),
    ],
)
def test_zero_or_nan_flops_in_a_cluster_file_are_refused_at_load(
    bf16: float, needle: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    cluster = _cluster_file(tmp_path, {"bf16": bf16})
    for command in (SEARCH, [*ESTIMATE, "--dp", "8"]):
        args = [arg if arg != "dgx-a100-80g:1" else cluster for arg in command]
        assert needle in refused(args, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"bandwidth": float("nan")}, "Input should be a finite number"),
        ({"latency": float("nan")}, "Input should be a finite number"),
        ({"latency": -1e-6}, "link 2->3 has latency -1e-06; it must be >= 0"),
    ],
)
def test_nan_or_negative_link_figures_are_refused_at_load(
    change: dict[str, object], needle: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    cluster = _cluster_file(tmp_path, change, explicit_links=True)
    args = [arg if arg != "dgx-a100-80g:1" else cluster for arg in [*ESTIMATE, "--dp", "8"]]
    assert needle in refused(args, monkeypatch, capsys)


def test_a_dry_run_of_a_plan_larger_than_its_cluster_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "plan.json"
    assert cli([*ESTIMATE, "--dp", "8", "--output", str(path)], monkeypatch, capsys)[0] == 0
    raw = json.loads(path.read_text())
    raw["layout"]["data_parallel_degree"] = 16  # 16 ranks on the 8 devices of dgx-a100-80g:1
    path.write_text(json.dumps(raw))
    output = refused(["run", str(path), "--dry-run", "--rank", "9"], monkeypatch, capsys)
    assert "layout has 16 ranks, but cluster 'dgx-a100-80g' (dgx-a100-80g:1) has 8 devices" in output
    with pytest.raises(SchemaError):
        load_plan(path)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"step_time_s": 0.0}, "estimate.step_time_s=0.0 must be > 0"),
        ({"peak_memory_bytes": -1.0}, "estimate.peak_memory_bytes=-1.0 must be >= 0"),
        ({"stages": []}, "estimate.stages is empty"),
    ],
)
def test_explain_on_a_plan_with_an_impossible_estimate_is_refused(
    change: dict[str, object], needle: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    path = tmp_path / "plan.json"
    assert cli([*ESTIMATE, "--dp", "8", "--output", str(path)], monkeypatch, capsys)[0] == 0
    raw = json.loads(path.read_text())
    raw["estimate"].update(change)  # explain divided by a step time of 0
    path.write_text(json.dumps(raw))
    assert needle in refused(["explain", str(path)], monkeypatch, capsys)


# --- absurd sizes: refused at once, not searched for hours ----------------------------------------


@pytest.mark.parametrize(
    ("batch", "needle"),
    [
        (10**18, "global_batch_size=1000000000000000000 is too large a number (at most 2^53)"),
        (MAX_GLOBAL_BATCH + 1, f"larger than any batch this planner plans (at most {MAX_GLOBAL_BATCH:,})"),
    ],
)
def test_an_absurd_global_batch_is_refused(batch: int, needle: str, monkeypatch, capsys) -> None:
    args = [str(batch) if arg == "32" else arg for arg in SEARCH]
    assert needle in refused(args, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("layers", "needle"),
    [
        (10**30, "num_hidden_layers=1000000000000000000000000000000 is too large a number"),
        (MAX_LAYERS + 1, f"larger than any model this planner plans (at most {MAX_LAYERS:,})"),
    ],
)
def test_an_absurd_layer_count_is_refused(layers: int, needle: str, tmp_path: Path, monkeypatch, capsys) -> None:
    raw = {**load_model("tiny-moe").model_dump(mode="json", exclude={"name"}), "num_hidden_layers": layers}
    model = tmp_path / "model.json"
    model.write_text(json.dumps(raw))
    for command in (SEARCH, [*ESTIMATE, "--dp", "8"]):
        args = [arg if arg != "tiny-gpt" else str(model) for arg in command]
        assert needle in refused(args, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("hidden_size", 2**40, MAX_WIDTH),
        ("intermediate_size", MAX_WIDTH + 1, MAX_WIDTH),
        ("moe_intermediate_size", 2**40, MAX_WIDTH),
        ("head_dim", 2**30, MAX_WIDTH),
        ("vocab_size", 2**40, MAX_VOCAB),
        ("num_attention_heads", 2**30, MAX_HEADS),
        ("max_position_embeddings", 2**40, 2**30),
    ],
)
def test_an_absurd_model_width_or_vocabulary_is_refused(
    field: str, value: int, limit: int, tmp_path: Path, monkeypatch, capsys
) -> None:
    raw = {**load_model("tiny-moe").model_dump(mode="json", exclude={"name"}), field: value}
    model = tmp_path / "model.json"
    model.write_text(json.dumps(raw))
    line = refused([arg if arg != "tiny-gpt" else str(model) for arg in [*ESTIMATE, "--dp", "8"]], monkeypatch, capsys)
    assert f"{field}={value} is larger than any model this planner plans (at most {limit:,}); fix the value" in line


@pytest.mark.parametrize("scale", ["compute_scale", "tensor_parallel_scale", "communication_scale"])
def test_a_zero_time_scale_in_a_calibration_is_refused(scale: str, tmp_path: Path, monkeypatch, capsys) -> None:
    path = Path(_cluster_file(tmp_path, {}))
    raw = json.loads(path.read_text())
    raw["calibration"] = {scale: 0, "created": "2026-01-01T00:00:00", "trials": 3, "memory_samples": 0}
    path.write_text(json.dumps(raw))
    line = refused(
        [arg if arg != "dgx-a100-80g:1" else str(path) for arg in [*ESTIMATE, "--dp", "8"]], monkeypatch, capsys
    )
    assert f"calibration.{scale}=0.0 must be > 0 (at 0 every term it scales costs 0 s)" in line


def test_a_cluster_beyond_any_built_is_refused(monkeypatch, capsys) -> None:
    nodes = MAX_DEVICES // 8 + 1
    for spec in (f"dgx-a100-80g:{nodes}", f"dgx-a100-80g:{10**30}+dgx-h100:1"):
        args = [arg if arg != "dgx-a100-80g:1" else spec for arg in SEARCH]
        assert "is more than any cluster this planner plans" in refused(args, monkeypatch, capsys)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--tp", f"1-{10**9}"], "is more than any degree or micro-batch this planner plans"),
        (["--capacity-factor", "nan"], "Invalid value for '--capacity-factor'"),
        (["--capacity-factor", "inf"], "inf is not a finite number"),
        (["--time-limit", "inf"], "inf is not a finite number"),
        (["--seed", str(10**18)], "Invalid value for '--seed'"),  # the CP-SAT solver's seed is 32 bits
    ],
)
def test_absurd_search_options_are_refused(extra: list[str], needle: str, monkeypatch, capsys) -> None:
    assert needle in refused([*SEARCH, *extra], monkeypatch, capsys)


def test_a_huge_max_tp_is_the_largest_cluster(monkeypatch, capsys) -> None:
    start = time.perf_counter()
    code, output = cli([*SEARCH, "--max-tp", str(10**30)], monkeypatch, capsys)  # not a set of 10^30 degrees
    assert code == 0, output
    assert time.perf_counter() - start < 10


def test_a_real_runs_options_under_dry_run_are_refused_not_ignored(tmp_path: Path, monkeypatch, capsys) -> None:
    """A dry run traces one step of synthetic tokens and writes nothing: --data, --resume,
    --trace-routing and the like would be ignored in silence."""
    path = tmp_path / "plan.json"
    assert cli([*ESTIMATE, "--dp", "8", "--output", str(path)], monkeypatch, capsys)[0] == 0
    output = refused(["run", str(path), "--dry-run", "--data", "tokens.bin", "--resume"], monkeypatch, capsys)
    assert "--data, --resume have no effect under --dry-run" in output and "drop them" in output
    output = refused(["run", str(path), "--dry-run", "--trace-routing", "/ro/x.npz"], monkeypatch, capsys)
    assert "--trace-routing has no effect under --dry-run" in output and "drop it" in output
