"""``planner run`` checks a plan's pipeline flushes once, in ``check_runnable`` before any work; a
Trainer built without that check (a library user's, a test's) still checks them itself."""

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cpu_cluster
from harness import run_ranks

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
    assert run_ranks(1, _checks, str(tmp_path / "plan.json"), workdir=tmp_path / "ranks") == {"run": 1, "direct": 1}
