"""`planner profile` on one rank (one GPU, or one CPU process): no links, collectives,
tensor-parallel layers, pipeline slot or FSDP unit cost, said in the profile and in the output;
the profile then prices one-rank layouts (`planner search` and `planner estimate`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.clusters import load_cluster
from planner.schemas import DType, LayerRecord, OpKind, OptimizerRecord

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

ONE_RANK = ["--model", "tiny-gpt", "--global-batch-size", "4", "--seq-len", "128", "--dtype", "fp32"]
ONE_RANK += ["--dp", "1", "--tp", "1", "--pp", "1"]


def test_a_one_rank_profile_says_what_it_skipped_and_prices_one_rank_layouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "cluster.json"
    # fp32 only and the layer at one micro-batch size: the phases a one-rank job has, at least cost
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "planner",
           "profile", "--output", str(out), "--quick", "--model", "tiny-gpt", "--seq-len", "128", "--dtype", "fp32",
           "--layer-micro-batches", "1", "--layer-repeats", "3"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "not measured: links" in output and "not measured: collectives" in output, output
    profile = load_cluster(str(out))
    assert profile.world_size == 1 and profile.collectives == ()
    skipped = " ".join(profile.provenance.not_measured)
    for phase in ("links", "collectives", "tensor-parallel layers", "pipeline slot", "(FSDP) unit cost"):
        assert phase in skipped
    records = profile.device.op_records
    assert {(r.op, r.tensor_parallel_degree) for r in records if isinstance(r, LayerRecord)} == {
        (OpKind.LAYER, 1),
        (OpKind.OUTPUT_LAYER, 1),
    }
    assert [r.dtype for r in records if isinstance(r, OptimizerRecord)] == [DType.FP32]

    plan = tmp_path / "plan.json"
    code, stdout, err = planner_main(["search", *ONE_RANK, "--cluster", str(out), "--output", str(plan)], monkeypatch)
    assert code == 0, stdout + err
    layout = json.loads(plan.read_text())["layout"]
    assert (layout["data_parallel_degree"], layout["tensor_parallel_degree"]) == (1, 1)
    args = [
        "estimate",
        *ONE_RANK,
        "--cluster",
        str(out),
        "--micro-batch-size",
        "2",
        "--output",
        str(tmp_path / "e.json"),
    ]
    code, stdout, err = planner_main(args, monkeypatch)
    assert code == 0, stdout + err
    estimate = json.loads((tmp_path / "e.json").read_text())["estimate"]
    assert estimate["step_time_s"] > 0 and estimate["time"]["optimizer_s"] > 0
    assert estimate["time"]["data_parallel_comm_s"] == 0 and estimate["time"]["tensor_parallel_comm_s"] == 0
