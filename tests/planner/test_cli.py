"""The CLI contract: estimate's JSON keys, exit code 2 with one line for bad input, help texts."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app

BASE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "64", "--seq-len", "4096"]


def run(args: list[str]) -> tuple[int, str, str]:
    """Run the console script as a user would, so exit codes and stderr are the real ones."""
    proc = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_estimate_json_has_the_contract_keys() -> None:
    result = CliRunner().invoke(app, [*BASE, "--dp", "8", "--zero-stage", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in (
        "step_time_s",
        "tokens_per_s",
        "model_flops_per_step",
        "mfu",
        "peak_memory_bytes",
        "time_breakdown_s",
    ):
        assert key in out
    assert set(out["memory_breakdown_bytes"]) == {
        "weights",
        "gradients",
        "optimizer_states",
        "activations",
        "other",
    }
    assert out["peak_memory_bytes"] == pytest.approx(sum(out["memory_breakdown_bytes"].values()))
    assert out["step_time_s"] == pytest.approx(
        sum(v for k, v in out["time_breakdown_s"].items() if "overlapped" not in k)
    )
    assert 0 < out["mfu"] < 1


def test_estimate_table_names_units() -> None:
    result = CliRunner().invoke(app, [*BASE, "--dp", "4", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert "GiB = 2^30 bytes" in result.output and "step time" in result.output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--dp", "3", "--tp", "3"], "tp=3 does not divide num_attention_heads=32"),
        (["--dp", "4"], "4 ranks, but cluster 'dgx-h100' has 8"),
        (["--dp", "8", "--micro-batch-size", "3"], "not divisible by dp x micro-batch"),
        (["--dp", "8", "--sequence-parallel"], "sequence_parallel needs tensor_parallel_degree > 1"),
        (["--dp", "8", "--layer-split", "a,b"], "--layer-split"),
    ],
)
def test_bad_layouts_exit_2_with_one_line(extra: list[str], needle: str) -> None:
    code, out, err = run([*BASE, *extra])
    assert code == 2, (out, err)
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("model", "cluster", "needle"),
    [
        ("nope", "dgx-h100:1", "llama3-8b"),
        ("llama3-8b", "dgx-h100", "dgx-h100:NODES"),
        ("llama3-8b", "dgx-h100:0", "dgx-h100:0"),
        ("llama3-8b", "nowhere.json", "nowhere.json"),
    ],
)
def test_bad_inputs_exit_2_and_say_what_to_do(model: str, cluster: str, needle: str) -> None:
    code, _, err = run(["estimate", "-m", model, "-c", cluster, "--global-batch-size", "8", "--seq-len", "128"])
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_malformed_model_file_exits_2(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "model.json"
    path.write_text('{"hidden_size": 64, "num_hidden_layers": 2,')
    code, _, err = run(["estimate", "-m", str(path), "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "8"])
    assert code == 2 and "model.json" in err


def test_usage_errors_exit_2() -> None:
    code, _, err = run([*BASE, "--recompute", "sometimes"])
    assert code == 2 and "sometimes" in err


def test_help_teaches_with_an_example() -> None:
    result = CliRunner().invoke(app, ["estimate", "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output and "--global-batch-size" in result.output
    presets = CliRunner().invoke(app, ["presets"])
    assert "tiny-gpt" in presets.output and "dgx-a100-80g:NODES" in presets.output


def test_a_precision_the_profile_lacks_exits_2_and_says_how_to_profile_it(tmp_path: object) -> None:
    # A profile measured with --dtype bf16 has no fp32 peak.
    from pathlib import Path

    from conftest import make_cluster

    from planner.files.clusters import save_cluster
    from planner.schemas import DType

    cluster = make_cluster(per_node=2)
    device = cluster.device.model_copy(update={"peak_flop_per_s": {DType.BF16: 1e12}})
    path = Path(str(tmp_path)) / "cluster.json"
    save_cluster(cluster.model_copy(update={"device": device}), path)
    args = ["--global-batch-size", "8", "--seq-len", "128", "--dp", "2", "--dtype", "fp32"]
    code, _, err = run(["estimate", "-m", "tiny-gpt", "-c", str(path), *args])
    assert code == 2 and "planner profile without --dtype" in err and "Traceback" not in err


def test_the_library_logs_and_the_cli_shows_its_lines_on_stderr() -> None:
    # The profiler and the runtime log (they never print); main() routes our packages' records
    # to stderr: information as the bare line, warnings and errors with their level.
    code = (
        "import logging, planner.cli as cli\n"
        "cli._configure_logging()\n"
        "logging.getLogger('profiler.run').info('wrote cluster.json')\n"
        "logging.getLogger('profiler.run').error('rank 1: profiling stopped')\n"
        "logging.getLogger('some.library').info('not ours')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == ["wrote cluster.json", "ERROR: rank 1: profiling stopped"]


def test_no_library_module_prints() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    printing = [
        f"{path.relative_to(root)}:{node.lineno}"
        for package in ("planner", "cost_models", "profiler", "runtime")
        for path in sorted((root / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]
    assert printing == []


@pytest.mark.parametrize("sizes", ["0,2", "1,x", "1,,2", "-1"])
def test_bad_layer_micro_batches_exit_2_with_one_line(sizes: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused before the profiler starts: no torchrun needed.
    from harness import planner_main

    code, _, err = planner_main(["profile", "--layer-micro-batches", sizes], monkeypatch)
    assert code == 2, err
    assert f"--layer-micro-batches {sizes!r} must be positive whole numbers" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_layer_repeats_below_1_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import planner_main

    code, _, err = planner_main(["profile", "--layer-repeats", "0"], monkeypatch)
    assert code == 2 and "--layer-repeats" in err and "Traceback" not in err


def test_layer_micro_batches_are_timed_once_each_in_increasing_order() -> None:
    from planner.cli.testing_aids import parse_micro_batches

    assert parse_micro_batches("4,1,4,2") == (1, 2, 4)
    assert parse_micro_batches(None) is None
