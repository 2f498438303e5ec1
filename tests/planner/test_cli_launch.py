"""`planner launch` refuses, in one line with exit code 2, a plan the runtime would refuse: it
prints no command that could only fail on every node."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, ModelSpec, MoeDispatcher, Plan, PositionEmbedding, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError

CLUSTER_SPEC = "dgx-h100:1"
CLUSTER = load_cluster(CLUSTER_SPEC)


def _plan(model: str, layout: Layout, **training: object) -> Plan:
    spec, train = load_model(model), TrainingSpec(global_batch_size=16, seq_len=64, **training)  # type: ignore[arg-type]
    return make_plan(spec, train, CLUSTER, CLUSTER_SPEC, layout, estimate(spec, train, CLUSTER, layout))


def _plan_of(spec: ModelSpec, layout: Layout) -> Plan:
    train = TrainingSpec(global_batch_size=16, seq_len=64)
    return make_plan(spec, train, CLUSTER, CLUSTER_SPEC, layout, estimate(spec, train, CLUSTER, layout))


def _layout(dp: int, tp: int = 1, pp: int = 1, ep: int = 1, mb: int = 1, **more: object) -> Layout:
    return Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        expert_parallel_degree=ep,
        micro_batch_size=mb,
        **more,  # type: ignore[arg-type]
    )


REFUSED = {
    "tp-comm-overlap": (
        lambda: _plan("tiny-gpt", _layout(4, tp=2, sequence_parallel=True), tp_comm_overlap=True),
        "runs them synchronously; plan without --tp-comm-overlap",
    ),
    "vocabulary-overlap": (
        lambda: _plan("tiny-gpt", _layout(2, pp=4, mb=1, vocabulary_layout="vocab-2"), vocabulary_overlap=True),
        "runs each pass synchronously; plan without --vocabulary-overlap",
    ),
    "capacity-factor": (
        lambda: _plan("tiny-moe", _layout(8, ep=4), moe_capacity_factor=1.25),
        "routes every token to its experts (dropless); plan without --capacity-factor",
    ),
    "deepep": (
        lambda: _plan("tiny-moe", _layout(8, ep=4), moe_dispatcher=MoeDispatcher.DEEPEP),
        "plan with --moe-dispatcher alltoall",
    ),
    "fewer-micro-batches-than-stages": (
        lambda: _plan("tiny-gpt", _layout(2, pp=4, mb=4)),
        "2 micro-batch(es) a step through 4 pipeline stages",
    ),
    "hpz-tensor-parallel": (
        lambda: _plan("tiny-gpt", _layout(4, tp=2, zero_stage=ZeroStage.PARAMETERS, secondary_partition_size=2)),
        "secondary partition of 2 ranks (dp4 tp2 pp1 mb1 zero3 hpz2 rc-none) beside tensor or pipeline parallelism",
    ),
    "alibi": (
        lambda: _plan_of(
            load_model("tiny-gpt").model_copy(update={"position_embedding_type": PositionEmbedding.ALIBI}),
            _layout(8),
        ),
        "uses ALiBi position biases, which this runtime does not build",
    ),
    "zero3-experts-bf16": (
        lambda: _plan("tiny-moe", _layout(8, ep=4, zero_stage=ZeroStage.PARAMETERS)),
        "with expert parallelism runs in fp32 only so far",
    ),
}


def _launch(plan: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner", "launch", str(plan), *more],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_launch_refuses_a_plan_the_runtime_refuses(tmp_path: Path, case: str) -> None:
    make, reason = REFUSED[case]
    path = tmp_path / "plan.json"
    save_plan(make(), path)
    for more in ((), ("--output", str(tmp_path / "launch.sh"))):
        proc = _launch(path, *more)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert len(proc.stderr.splitlines()) == 1 and reason in proc.stderr, proc.stderr
        assert not (tmp_path / "launch.sh").exists()


RUNS = {
    "expert-parallel": lambda: _plan("tiny-moe", _layout(8, ep=4)),
    "hsdp-hpz": lambda: _plan(
        "tiny-gpt", _layout(8, zero_stage=ZeroStage.PARAMETERS, sharding_group_size=4, secondary_partition_size=2)
    ),
    "hsdp-zero1-tensor-pipeline": lambda: _plan(
        "tiny-gpt", _layout(2, tp=2, pp=2, zero_stage=ZeroStage.OPTIMIZER, sharding_group_size=1)
    ),
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_launch_prints_a_plan_the_runtime_runs(tmp_path: Path, case: str) -> None:
    path = tmp_path / "plan.json"
    save_plan(RUNS[case](), path)
    proc = _launch(path)
    assert proc.returncode == 0, proc.stderr
    assert "torchrun --standalone --nproc-per-node 8 -m planner run" in proc.stdout


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_runtime_refuses_the_same_plans_with_the_same_line(case: str) -> None:
    from runtime.run import check_world  # imports torch

    make, reason = REFUSED[case]
    with pytest.raises(InfeasibleConfigError, match=re.escape(reason)):
        check_world(make(), CLUSTER.world_size, cuda=True)
