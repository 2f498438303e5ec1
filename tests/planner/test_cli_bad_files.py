"""Files that are not what a command takes end in one line naming the file, the cause and the fix
(exit 2), never a traceback: JSON or YAML nested deeper than Python's parsers recurse, read by
every command that reads a model, cluster profile or plan file; a plan read with a profile of another
cluster than its own (a swapped cluster.json) or without its profile."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.cluster_presets import cluster_preset
from planner.files.clusters import save_cluster
from planner.schemas import Layout, TrainingSpec

BATCH = ["--global-batch-size", "16", "--seq-len", "128"]
DEEP = {"deep.json": "[" * 100_000 + "]" * 100_000, "deep.yaml": "a: " + "[" * 100_000}
NESTED_COMMANDS = {
    "estimate -m": ["estimate", "-m", "{f}", "-c", "dgx-h100:1", *BATCH, "--dp", "8"],
    "search -c": ["search", "-m", "tiny-gpt", "-c", "{f}", *BATCH],
    "estimate --plan": ["estimate", "--plan", "{f}"],
    "explain": ["explain", "{f}"],
    "export": ["export", "{f}", "--to", "torchtitan"],
    "launch": ["launch", "{f}"],
    "replan": ["replan", "{f}", "-c", "dgx-h100:1"],
    "run --dry-run": ["run", "--dry-run", "{f}"],
}


def one_line(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    code, out, err = planner_main(args, monkeypatch, cwd=tmp_path)
    assert code == 2 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1, out + err
    return err.strip()


@pytest.mark.parametrize("command", NESTED_COMMANDS)
def test_a_deeply_nested_file_is_one_line(command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = "deep.yaml" if command == "estimate -m" else "deep.json"
    (tmp_path / name).write_text(DEEP[name])
    line = one_line([a.replace("{f}", name) for a in NESTED_COMMANDS[command]], monkeypatch, tmp_path)
    assert line.startswith(f"error: {name}: nested too deeply to read (maximum recursion depth exceeded")
    assert line.endswith("give a planner file (a few levels deep)")


PLAN_READERS = {
    "explain": ["explain", "plan.json"],
    "export": ["export", "plan.json", "--to", "torchtitan"],
    "launch": ["launch", "plan.json"],
    "estimate --plan": ["estimate", "--plan", "plan.json"],
    "run --dry-run": ["run", "--dry-run", "plan.json"],
}


@pytest.fixture
def planned(tmp_path: Path) -> Path:
    """A plan of tiny-gpt made on cluster.json (a dgx-h100 node) beside it, and orig.json, its copy."""
    from planner import api

    save_cluster(cluster_preset("dgx-h100", 1), tmp_path / "cluster.json")
    (tmp_path / "orig.json").write_bytes((tmp_path / "cluster.json").read_bytes())
    model, cluster = api.load_model("tiny-gpt"), api.load_cluster(str(tmp_path / "cluster.json"))
    training, layout = (
        TrainingSpec(global_batch_size=16, seq_len=128),
        Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1),
    )
    plan = api.make_plan(
        model, training, cluster, str(tmp_path / "cluster.json"), layout, api.estimate(model, cluster, training, layout)
    )
    api.save_plan(plan, tmp_path / "plan.json")
    return tmp_path


@pytest.mark.parametrize("command", PLAN_READERS)
def test_a_plan_whose_profile_was_swapped_for_another_clusters_is_refused(
    command: str, planned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_cluster(cluster_preset("dgx-a100-80g", 1), planned / "cluster.json")
    line = one_line(PLAN_READERS[command], monkeypatch, planned)
    assert "cluster.json' is another cluster profile than the plan's: the plan was made for 'dgx-h100'" in line
    assert "this is 'dgx-a100-80g'" in line and "pass --cluster with the plan's profile" in line


@pytest.mark.parametrize("command", ["explain", "export", "launch"])
def test_cluster_points_a_plan_at_its_profile(command: str, planned: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_cluster(cluster_preset("dgx-a100-80g", 1), planned / "cluster.json")
    code, out, err = planner_main([*PLAN_READERS[command], "--cluster", "orig.json"], monkeypatch, cwd=planned)
    assert code == 0, out + err


def test_a_recalibrated_profile_is_a_warning(planned: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = json.loads((planned / "cluster.json").read_text())
    raw["calibration"] = {"compute_scale": 2.0, "created": "2026-01-01T00:00:00", "trials": 3, "memory_samples": 0}
    (planned / "cluster.json").write_text(json.dumps(raw))
    code, out, err = planner_main(["explain", "plan.json"], monkeypatch, cwd=planned)
    assert code == 0, out + err
    assert "was re-measured or recalibrated since the plan was made (same 8 x NVIDIA H100" in err


@pytest.mark.parametrize("command", ["explain", "estimate --plan"])
def test_a_plan_copied_without_its_profile_says_to_pass_cluster(
    command: str, planned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (planned / "cluster.json").unlink()
    line = one_line(PLAN_READERS[command], monkeypatch, planned)
    assert "cluster.json' is missing (a plan names its profile file, it does not hold it)" in line
    assert line.endswith("copy the profile to that path, or pass --cluster PROFILE.json")
