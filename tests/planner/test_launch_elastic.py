"""``planner launch --elastic MIN:MAX``: torchrun's elastic form of every node's line, with the
``planner run`` arguments a restart needs to re-plan and resume; refused in one line without a
checkpoint folder or with more nodes than the plan has."""

import shlex
from pathlib import Path

import pytest
from harness import planner_main

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, TrainingSpec

SPEC = "dgx-h100:4"


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    cluster, model, training = (
        load_cluster(SPEC),
        load_model("tiny-gpt"),
        TrainingSpec(global_batch_size=64, seq_len=64),
    )
    layout = Layout(data_parallel_degree=32, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=2)
    made = make_plan(model, training, cluster, SPEC, layout, estimate(model, training, cluster, layout))
    save_plan(made, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def test_every_node_gets_the_same_elastic_line(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["launch", str(plan), "--elastic", "2:4", "--max-restarts", "5", "--checkpoint-dir", "/shared/ckpt"]
    code, out, err = planner_main([*args, "--master-addr", "10.0.0.1", "--steps", "100"], monkeypatch)
    assert code == 0, err
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(lines) == 4 and len(set(lines)) == 1  # no --node-rank: the rendezvous numbers the nodes
    argv = shlex.split(lines[0])
    # a fresh store each round: the shared one keeps the last round's addresses (planner.export.torchrun)
    assert all(line.startswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun ") for line in lines)
    argv = argv[1:]
    assert argv[: argv.index("-m")] == [
        "torchrun",
        "--nnodes",
        "2:4",
        "--nproc-per-node",
        "8",
        "--max-restarts",
        "5",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
        "--rdzv-id",
        argv[argv.index("--rdzv-id") + 1],
    ]
    code, out, _ = planner_main([*args, "--last-call", "5"], monkeypatch)
    again = shlex.split(next(line for line in out.splitlines() if not line.startswith("#")))
    assert again[again.index("--rdzv-conf") : again.index("-m")] == ["--rdzv-conf", "last_call_timeout=5"]
    assert argv[argv.index("-m") :] == [
        "-m",
        "planner",
        "run",
        str(plan),
        "--steps",
        "100",
        "--report",
        "report.json",
        "--elastic",
        "--checkpoint-dir",
        "/shared/ckpt",
        "--checkpoint-every",
        "1",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--elastic", "2:4"], "error: --elastic resumes each restart from a checkpoint: give their folder with"),
        (["--elastic", "2:5", "--checkpoint-dir", "c"], "error: --elastic 2:5 asks for up to 5 nodes, but the plan"),
        (["--elastic", "3:2", "--checkpoint-dir", "c"], "error: --elastic 3:2 must be MIN:MAX nodes with 1 <= MIN"),
        (["--elastic", "two", "--checkpoint-dir", "c"], "error: --elastic 'two' must be MIN:MAX nodes, e.g. 2:4"),
    ],
)
def test_an_elastic_launch_it_cannot_make_is_refused_in_one_line(
    plan: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], message: str
) -> None:
    code, out, err = planner_main(["launch", str(plan), *options], monkeypatch)
    assert (code, out) == (2, "")
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err
