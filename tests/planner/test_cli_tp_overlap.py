"""--tp-comm-overlap: estimate and search price tensor-parallel collectives behind their GEMMs on
GPUs, the plan file carries the choice, and the runtime, which runs them synchronously, refuses
such a plan on GPUs before any work."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.plans import load_plan
from planner.schemas.errors import InfeasibleConfigError
from runtime.run import check_world

BASE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "64", "--seq-len", "4096"]
BASE += ["--dp", "2", "--tp", "4", "--sequence-parallel", "--micro-batch-size", "1", "--format", "json"]


def test_the_option_prices_overlap_and_the_plan_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, plain, err = planner_main(BASE, monkeypatch)
    assert code == 0, err
    path = tmp_path / "overlap.json"
    code, overlapped, err = planner_main([*BASE, "--tp-comm-overlap", "--output", str(path)], monkeypatch)
    assert code == 0, err
    tp_s = [json.loads(out)["time_breakdown_s"]["tensor_parallel_comm"] for out in (plain, overlapped)]
    assert 0 < tp_s[1] < tp_s[0]
    plan = load_plan(path)
    assert plan.training.tp_comm_overlap
    with pytest.raises(InfeasibleConfigError, match="runs them synchronously; plan without --tp-comm-overlap"):
        check_world(plan, plan.cluster.world_size, cuda=True)
