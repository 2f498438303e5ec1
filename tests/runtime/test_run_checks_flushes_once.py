"""``planner run`` checks a plan's pipeline flushes once, in ``check_runnable`` before any work; a
Trainer built without that check (a library user's, a test's) still checks them itself."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cpu_cluster

import runtime.run
import runtime.trainer
from cost_models.estimate import estimate
from planner.files.clusters import save_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, read_plan, save_plan
from planner.schemas import Layout, TrainingSpec, runtime_support
from planner.schemas.settings import RunSettings
from runtime.trainer import Trainer

pytestmark = pytest.mark.distributed


class _Built(Exception):
    """Stops ``runtime.run.run`` once its Trainer is built: what follows checks nothing more."""


class _StopOnceBuilt(Trainer):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        raise _Built


def _checks(plan_path: str) -> dict[str, int]:
    """How often the pipeline flushes are checked by ``runtime.run.run`` up to its Trainer, and by a
    Trainer built directly (on a rank of a 1-rank job)."""
    calls: list[object] = []
    real = runtime_support.check_pipeline_flushes

    def counted(*args: Any) -> None:
        calls.append(args)
        real(*args)

    plan, sha256 = read_plan(plan_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime_support, "check_pipeline_flushes", counted)  # as check_runnable calls it
        patch.setattr(runtime.trainer, "check_pipeline_flushes", counted)
        patch.setattr(runtime.run, "Trainer", _StopOnceBuilt)
        patch.setitem(os.environ, "RANK", "0")
        patch.setitem(os.environ, "WORLD_SIZE", "1")
        settings = RunSettings(plan=plan, plan_sha256=sha256, report_path=Path(plan_path).with_name("report.json"))
        with pytest.raises(_Built):
            runtime.run.run(settings)
        in_run = len(calls)
        Trainer(
            plan.model,
            plan.layout,
            global_batch_size=plan.training.global_batch_size,
            seed=0,
            optimizer="sgd",
            lr=0.1,
            device=torch.device("cpu"),
        )
    return {"run": in_run, "direct": len(calls) - in_run}


def test_a_run_checks_the_flushes_once_and_a_trainer_alone_checks_them(tmp_path: Path) -> None:
    cluster = cpu_cluster(1)
    save_cluster(cluster, tmp_path / "cluster.json")
    model, training = load_model("tiny-gpt"), TrainingSpec(global_batch_size=2, seq_len=32)
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    plan = make_plan(
        model, training, cluster, str(tmp_path / "cluster.json"), layout, estimate(model, training, cluster, layout)
    )
    save_plan(plan, tmp_path / "plan.json")
    # A fresh interpreter, not a fork of this one: a fork after other tests' threads can hang.
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from test_run_checks_flushes_once import _checks; print(json.dumps(_checks(sys.argv[2])))"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": "0"}
    here = str(Path(__file__).resolve().parent)
    tests = str(Path(__file__).resolve().parents[1])
    args = [sys.executable, "-c", code, here, str(tmp_path / "plan.json")]
    proc = subprocess.run(
        args,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": f"{tests}:{env.get('PYTHONPATH', '')}"},
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"run": 1, "direct": 1}
