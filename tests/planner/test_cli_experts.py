"""Mixture-of-experts input on the command line: expert-parallel degrees that do not split the
model's experts and routing traces that do not fit it exit 2 with one line; `planner explain
--routing-trace` compares a plan's expert placement with round-robin; `planner search
--expert-replicas`."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_cluster
from harness import planner_main
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.files.clusters import save_cluster
from planner.files.routing_trace import write_trace
from planner.schemas import DeviceMap, Layout, TrainingSpec
from planner.schemas.errors import PlannerError, SchemaError
from planner.schemas.runtime_support import check_runnable
from planner.schemas.settings import SearchSettings

MODEL = "tiny-moe"  # 4 MoE layers of 4 experts, top-2
CLUSTER = "dgx-h100:2"  # 16 ranks, 8 per node
TRAINING = TrainingSpec(global_batch_size=64, seq_len=128)


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The console script as a user runs it: real exit codes and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _plan(tmp_path: Path, ep: int, name: str = "plan.json") -> Path:
    layout = Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=4,
        expert_parallel_degree=ep,
    )
    model, cluster = api.load_model(MODEL), api.load_cluster(CLUSTER)
    est = api.estimate(model, cluster, TRAINING, layout)
    path = tmp_path / name
    api.save_plan(api.make_plan(model, TRAINING, cluster, CLUSTER, layout, est), path)
    return path


def _edited(plan: Path, ep: int) -> Path:
    """The plan file with its expert-parallel degree changed by hand."""
    raw = json.loads(plan.read_text())
    raw["layout"]["expert_parallel_degree"] = ep
    edited = plan.with_name(f"ep{ep}.json")
    edited.write_text(json.dumps(raw))
    return edited


def test_estimate_refuses_an_ep_that_does_not_divide_the_experts() -> None:
    args = ["-m", MODEL, "-c", CLUSTER, "--global-batch-size", "64", "--seq-len", "128", "--dp", "16"]
    code, _, err = run(["estimate", *args, "--ep", "8"])
    one_line(code, err, "expert_parallel_degree=8 does not divide the 4 experts of 'tiny-moe'")
    assert "divides both 4 and data_parallel_degree=16: 1, 2, 4" in err


@pytest.mark.parametrize(
    "command",
    [["estimate", "--plan", "{plan}"], ["explain", "{plan}"], ["run", "{plan}", "--dry-run"], ["launch", "{plan}"]],
)
def test_a_plan_edited_to_an_ep_that_does_not_divide_the_experts_is_refused(tmp_path: Path, command: list[str]) -> None:
    edited = _edited(_plan(tmp_path, ep=4), 8)
    code, out, err = run([part.format(plan=edited) for part in command])
    one_line(code, err, f"{edited}: not a valid plan: expert_parallel_degree=8 does not divide the 4 experts")
    assert out == ""


def test_run_under_torchrun_refuses_the_edited_plan_before_any_work(tmp_path: Path) -> None:
    edited = _edited(_plan(tmp_path, ep=4), 8)
    # As each rank sees it under torchrun: the plan is read before torch and the process group.
    env = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    code, _, err = run(["run", str(edited), "--report", str(tmp_path / "r.json")], env)
    one_line(code, err, "expert_parallel_degree=8 does not divide the 4 experts")
    assert not (tmp_path / "r.json").exists()


def _hot_trace(path: Path, layers: int = 4, experts: int = 4, tokens: int = 10) -> Path:
    """Every token to experts 0 and 1 in every MoE layer (hand-worked in test_placement_comparison)."""
    write_trace(path, np.tile(np.array([0, 1]), (tokens, layers, 1)), experts, MODEL)
    return path


def _spread_plan(tmp_path: Path, ep: int = 2) -> Path:
    """tiny-moe on 2 nodes of 2 devices, dp 4, ranks 0-3 on devices 0, 2, 1, 3: each
    expert-parallel group of 2 spans both nodes."""
    cluster_path = tmp_path / "cluster.json"
    cluster = make_cluster(nodes=2, per_node=2)
    save_cluster(cluster, cluster_path)
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=ep,
        device_map=DeviceMap(devices=(0, 2, 1, 3)),
    )
    model = api.load_model(MODEL)
    est = api.estimate(model, cluster, TRAINING, layout)
    path = tmp_path / f"spread-ep{ep}.json"
    api.save_plan(api.make_plan(model, TRAINING, cluster, str(cluster_path), layout, est), path)
    return path


def _cells(output: str, row: str) -> list[str]:
    (line,) = [x for x in output.splitlines() if x.startswith(f"│ {row} ")]
    return [cell.strip() for cell in line.split("│")[2:-1]]


def test_explain_compares_the_placement_with_round_robin_on_a_trace(tmp_path: Path) -> None:
    # Hand-worked in test_placement_comparison: contiguous vs round-robin, each group across nodes.
    plan = _spread_plan(tmp_path)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["explain", str(plan), "--routing-trace", str(_hot_trace(tmp_path / "t.npz"))]
    )
    assert result.exit_code == 0, result.output
    assert "10 tokens, ep=2, 2 group(s) on up to 2 node(s) each" in result.output
    assert _cells(result.output, "hottest rank") == ["80", "40", "2.00"]
    assert _cells(result.output, "mean rank") == ["40", "40", "1.00"]
    assert _cells(result.output, "hottest / mean rank") == ["2.00", "1.00", "2.00"]
    assert _cells(result.output, "cross-rank, between consecutive layers") == ["0", "60", "0.00"]
    assert _cells(result.output, "cross-node (the busiest group's)") == ["0", "60", "0.00"]
    assert "contiguous (default) / round-robin" in result.output


def test_explain_says_how_to_get_the_placement_figures_only_where_there_are_some(tmp_path: Path) -> None:
    hint = "--routing-trace TRACE.npz` compares it with round-robin"
    placed = CliRunner().invoke(app, ["explain", str(_spread_plan(tmp_path))])
    assert placed.exit_code == 0 and hint in placed.output
    one_rank = _spread_plan(tmp_path, ep=1)
    assert hint not in CliRunner().invoke(app, ["explain", str(one_rank)]).output
    traced = CliRunner().invoke(app, ["explain", str(one_rank), "--routing-trace", str(_hot_trace(tmp_path / "t.npz"))])
    assert traced.exit_code == 0 and "ep=1, every rank hosts every expert" in traced.output


def _bad_traces(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Trace files that are not a trace of tiny-moe, and what the refusal says of each."""
    ids = np.zeros((4, 4, 2), dtype=np.int64)
    text, npy = tmp_path / "text.npz", tmp_path / "ids.npy"
    text.write_text("token,layer,expert\n")
    np.save(npy, ids)
    keys, dtype, shape = tmp_path / "keys.npz", tmp_path / "dtype.npz", tmp_path / "shape.npz"
    np.savez(keys, expert_ids=ids)
    np.savez(dtype, expert_ids=ids.astype(np.float64), num_experts=np.int64(4), model=np.str_(MODEL))
    np.savez(shape, expert_ids=ids[:, :, 0], num_experts=np.int64(4), model=np.str_(MODEL))
    return {
        "text": (text, "is not a NumPy .npz file"),
        "npy": (npy, "is not a NumPy .npz file"),
        "keys": (keys, "lacks ['num_experts', 'model']"),
        "dtype": (dtype, "expert_ids has dtype float64; expert ids are integers"),
        "shape": (shape, "expert_ids has shape (4, 4); it needs 3 non-empty dims"),
        "layers": (_hot_trace(tmp_path / "layers.npz", layers=3), "has 3 MoE layers, 4 experts and top-2, but"),
        "experts": (_hot_trace(tmp_path / "experts.npz", experts=8), "has 4 MoE layers, 8 experts and top-2, but"),
    }


SEARCH = ["search", "-m", MODEL, "-c", CLUSTER, "--global-batch-size", "64", "--seq-len", "128"]


@pytest.mark.parametrize("case", ["text", "npy", "keys", "dtype", "shape", "layers", "experts"])
@pytest.mark.parametrize("command", ["search", "explain"])
def test_a_trace_that_is_not_one_of_the_model_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, case: str
) -> None:
    trace, needle = _bad_traces(tmp_path)[case]
    args = SEARCH if command == "search" else ["explain", str(_plan(tmp_path, ep=4))]
    code, out, err = planner_main([*args, "--routing-trace", str(trace)], monkeypatch)
    one_line(code, err, needle)
    assert f"routing trace {str(trace)!r}" in err and out == ""  # refused before any output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--expert-replicas", "-1"], "--expert-replicas -1 must be 0 or more"),
        (["--expert-replicas", "2"], "--expert-replicas 2 needs a routing trace (--routing-trace)"),
    ],
)
def test_bad_expert_replicas_exit_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, extra: list[str], needle: str
) -> None:
    code, out, err = planner_main([*SEARCH, *extra], monkeypatch)
    one_line(code, err, needle)
    assert out == ""


def test_search_hands_the_replicas_to_the_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def search_outcome(model: Any, cluster: Any, training: Any, settings: SearchSettings, **kwargs: Any) -> Any:
        seen.update(expert_replicas=settings.expert_replicas, routing_trace=settings.routing_trace)
        raise SchemaError("stop here")

    import planner.flows.search

    monkeypatch.setattr(planner.flows.search, "search_outcome", search_outcome)  # what each recipe's search calls
    trace = _hot_trace(tmp_path / "t.npz")
    result = CliRunner().invoke(app, [*SEARCH, "--routing-trace", str(trace), "--expert-replicas", "1"])
    assert "stop here" in str(result.exception)
    assert seen["expert_replicas"] == 1 and seen["routing_trace"] == trace


def test_the_searched_placements_have_the_replica_slots(tmp_path: Path) -> None:
    trace = _hot_trace(tmp_path / "t.npz", tokens=50)
    plans = api.search(
        MODEL, make_cluster(per_node=4), TRAINING, SearchSettings(top_k=20, routing_trace=trace, expert_replicas=1)
    )
    placements = [(p.layout.expert_parallel_degree, p.layout.expert_placement) for p in plans]
    placed = [(ep, placement) for ep, placement in placements if placement is not None]
    assert placed
    for ep, placement in placed:
        assert placement.slots_per_rank == 4 // ep + 1  # E / ep experts and one replica per rank
        # The replicas go to the hot experts 0 and 1, the only ones that receive tokens.
        copies = [sum(e in rank for rank in placement.slots[0]) for e in range(4)]
        assert copies[0] + copies[1] == 2 + ep and copies[2] == copies[3] == 1


def test_an_ep_with_too_few_free_slots_keeps_its_experts_and_the_search_goes_on(tmp_path: Path) -> None:
    # 3 replicas: ep 2 has 4 - 2 = 2 free slots per rank, too few (the search used to stop there).
    trace = _hot_trace(tmp_path / "t.npz", tokens=50)
    plans = api.search(
        MODEL, make_cluster(per_node=4), TRAINING, SearchSettings(top_k=20, routing_trace=trace, expert_replicas=3)
    )
    assert plans
    assert not [p for p in plans if p.layout.expert_parallel_degree == 2 and p.layout.expert_placement is not None]


def test_a_capacity_factor_prices_padding_and_the_runtime_refuses_to_drop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["estimate", "-m", MODEL, "-c", CLUSTER, "--global-batch-size", "64", "--seq-len", "128", "--dp", "16"]
    base += ["--ep", "4", "--format", "json"]
    code, dropless, err = planner_main(base, monkeypatch)
    assert code == 0, err
    plan = tmp_path / "padded.json"
    code, padded, err = planner_main(
        [*base, "--capacity-factor", "1.5", "--pad-to-capacity", "--output", str(plan)], monkeypatch
    )
    assert code == 0, err
    expert_s = [json.loads(out)["time_breakdown_s"]["expert_parallel_comm"] for out in (dropless, padded)]
    assert expert_s[1] == pytest.approx(1.5 * expert_s[0])  # the all-to-all carries the padding
    # the runtime is dropless: it refuses the plan before any work, on every rank
    for name, value in {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "16"}.items():
        monkeypatch.setenv(name, value)
    code, _, err = planner_main(["run", str(plan), "--steps", "1"], monkeypatch)
    one_line(code, err, "drops tokens over a capacity factor of 1.5")
    monkeypatch.delenv("RANK")
    code, _, err = planner_main([*base, "--pad-to-capacity"], monkeypatch)
    one_line(code, err, "moe_pad_to_capacity needs a moe_capacity_factor")


def test_search_says_what_a_capacity_factor_drops_on_the_trace(tmp_path: Path) -> None:
    # Every token goes to experts 0 and 1 (half the pairs each); at capacity 1 each takes a quarter.
    trace = _hot_trace(tmp_path / "t.npz", tokens=50)
    args = [*SEARCH, "--routing-trace", str(trace), "--capacity-factor", "1"]
    result = CliRunner().invoke(app, [*args, "--stack", "megatron-lm"])  # the runtime is dropless
    assert result.exit_code == 0, result.output
    assert "capacity factor 1 drops 50.0% of the routed tokens on the routing trace" in result.output


def test_estimate_folds_experts_with_etp_1_and_refuses_other_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["estimate", "-m", "mixtral-8x7b", "-c", "dgx-h100:2", "--global-batch-size", "64", "--seq-len", "4096"]
    base += ["--dp", "8", "--tp", "2", "--ep", "8", "--zero-stage", "1", "--recompute", "full"]
    plan = tmp_path / "folded.json"
    code, _, err = planner_main([*base, "--etp", "1", "--sequence-parallel", "--output", str(plan)], monkeypatch)
    assert code == 0, err
    assert api.load_plan(plan).layout.folds_experts
    code, _, err = planner_main([*base, "--etp", "3", "--sequence-parallel"], monkeypatch)
    one_line(code, err, "expert_tensor_parallel_degree=3 must be 1 or tensor_parallel_degree=2")
    code, _, err = planner_main([*base, "--etp", "1"], monkeypatch)
    one_line(code, err, "needs sequence_parallel")


def test_the_deepep_dispatcher_is_priced_kept_in_the_plan_and_refused_by_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["estimate", "-m", "deepseek-v3", "-c", "dgx-h100:32", "--global-batch-size", "512", "--seq-len", "4096"]
    base += ["--dp", "64", "--pp", "4", "--ep", "64", "--zero-stage", "3", "--recompute", "full", "--format", "json"]
    code, plain, err = planner_main(base, monkeypatch)
    assert code == 0, err
    plan = tmp_path / "deepep.json"
    code, deepep, err = planner_main([*base, "--moe-dispatcher", "deepep", "--output", str(plan)], monkeypatch)
    assert code == 0, err
    a2a = [json.loads(out)["time_breakdown_s"]["expert_parallel_comm"] for out in (plain, deepep)]
    assert 0 < a2a[1] < a2a[0]
    loaded = api.load_plan(plan)
    assert loaded.training.moe_dispatcher == "deepep"
    # the runtime builds DeepSeek-V3's latent attention: its dispatcher is what the plan check refuses
    with pytest.raises(PlannerError, match="plan with --moe-dispatcher alltoall to run it"):
        check_runnable(loaded, cuda=True)
    code, _, err = planner_main([*base, "--moe-dispatcher", "nvshmem"], monkeypatch)
    assert code == 2 and "nvshmem" in err, err
