"""`planner replan` (``planner.flows.replan``): the same model and global batch searched
again for other devices, with what changed and the throughput lost."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from harness import planner_main

from cost_models.estimate import estimate
from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import load_plan, make_plan, save_plan
from planner.flows.replan import Replan, layout_changes
from planner.schemas import Layout, Plan, TrainingSpec, ZeroStage
from planner.schemas.settings import SearchSettings
from runtime.checkpoint_meta import layout_json, model_sha256

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)
GPT = load_model("tiny-gpt")


def _plan(cluster: str, layout: Layout, tokens_per_s: float | None = None) -> Plan:
    profile = load_cluster(cluster)
    est = estimate(GPT, TRAINING, profile, layout)
    if tokens_per_s is not None:
        est = replace(est, tokens_per_s=tokens_per_s)
    return make_plan(GPT, TRAINING, profile, cluster, layout, est)


def test_the_summary_names_each_change_and_the_throughput_lost() -> None:
    old = Layout(data_parallel_degree=8, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=2)
    new = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
    )
    replan = Replan(
        old=_plan("dgx-a100-80g:2", old, tokens_per_s=1000.0),
        new=_plan("dgx-a100-80g:1", new, tokens_per_s=750.0),
        checkpoint_step=40,
    )
    lines = replan.summary()
    assert lines[0] == "devices: 16 (dgx-a100-80g:2) -> 8 (dgx-a100-80g:1)"
    # 32 sequences: 8 replicas x 2 x 2 micro-batches before, 4 x 1 x 8 after
    assert lines[2:6] == (
        "  dp: 8 -> 4",
        "  micro-batch size: 2 -> 1",
        "  ZeRO stage: 0 -> 1",
        "  micro-batches per step and replica: 2 -> 8",
    )
    assert "predicted tokens/s: 1,000 -> 750 (throughput loss 25.0%)" in lines
    assert lines[-1] == "checkpoint: step 40 loads into the new layout (resharded)"
    assert replan.throughput_loss == pytest.approx(0.25)


def test_an_unchanged_layout_says_so() -> None:
    layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=4)
    assert layout_changes(layout, layout, 32) == ()
    assert "  no change" in Replan(old=_plan("dgx-a100-80g:1", layout), new=_plan("dgx-a100-80g:1", layout)).summary()


def test_replan_on_presets_writes_a_plan_for_the_devices_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = api.search(GPT, "dgx-a100-80g:2", TRAINING, SearchSettings(top_k=1))[0]
    save_plan(old, tmp_path / "plan.json")
    args = ["replan", str(tmp_path / "plan.json"), "-c", "dgx-a100-80g:1", "--output", str(tmp_path / "new.json")]
    code, out, err = planner_main(args, monkeypatch)
    assert code == 0, err
    new = load_plan(tmp_path / "new.json")
    assert new.layout.world_size == 8 and new.training == old.training and new.model == old.model
    lines = out.splitlines()
    assert lines[0] == "devices: 16 (dgx-a100-80g:2) -> 8 (dgx-a100-80g:1)"
    assert f"layout: {old.layout.describe()} -> {new.layout.describe()}" in lines
    loss = 1 - new.estimate.tokens_per_s / old.estimate.tokens_per_s
    assert any(line.endswith(f"(throughput loss {loss:.1%})") for line in lines), out
    assert new.estimate.tokens_per_s < old.estimate.tokens_per_s  # half the devices


def _checkpoint(folder: Path, global_batch_size: int, layout: Layout) -> Path:
    step = folder / "step-00000040"
    step.mkdir(parents=True)
    meta = {
        "step": 40,
        "plan_sha256": "p",
        "model_name": GPT.name,
        "model_sha256": model_sha256(GPT),
        "global_batch_size": global_batch_size,
        "layout": layout_json(layout),
    }
    (step / "meta.json").write_text(json.dumps(meta))
    (folder / "latest").write_text(step.name + "\n")
    return folder


OLD = Layout(data_parallel_degree=8, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=2)


def test_replan_checks_the_checkpoint_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_plan(_plan("dgx-a100-80g:2", OLD), tmp_path / "plan.json")
    folder = _checkpoint(tmp_path / "ckpt", TRAINING.global_batch_size, OLD)
    args = ["replan", str(tmp_path / "plan.json"), "-c", "dgx-a100-80g:1", "--checkpoint-dir", str(folder)]
    code, out, err = planner_main(args, monkeypatch)
    assert code == 0, err
    assert out.splitlines()[-1] == "checkpoint: step 40 loads into the new layout (resharded)"


def test_replan_refuses_a_checkpoint_of_another_global_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_plan(_plan("dgx-a100-80g:2", OLD), tmp_path / "plan.json")
    folder = _checkpoint(tmp_path / "ckpt", 64, OLD)
    args = ["replan", str(tmp_path / "plan.json"), "-c", "dgx-a100-80g:1", "--checkpoint-dir", str(folder)]
    code, _, err = planner_main(args, monkeypatch)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "global batch size 64, not this plan's 32" in err


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("missing", "the checkpoint folder '{folder}' does not exist"),
        ("empty", "no complete checkpoint in '{folder}'"),
        ("file", "the checkpoint folder '{folder}' is not a folder"),
    ],
)
def test_replan_refuses_a_checkpoint_folder_without_a_checkpoint_before_searching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, said: str
) -> None:
    """With replan's own fix (it has no --resume), and before the search: nothing is searched for a
    checkpoint that cannot be checked."""
    folder = tmp_path / kind
    if kind == "empty":
        folder.mkdir()
    elif kind == "file":
        folder.write_text("")
    save_plan(_plan("dgx-a100-80g:2", OLD), tmp_path / "plan.json")

    def no_search(*_: object, **__: object) -> None:
        raise AssertionError("searched before checking the checkpoint folder")

    monkeypatch.setattr("planner.flows.replan.search", no_search)
    args = ["replan", str(tmp_path / "plan.json"), "-c", "dgx-a100-80g:1", "--checkpoint-dir", str(folder)]
    code, _, err = planner_main(args, monkeypatch)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert said.format(folder=folder) in err
    assert "leave out --checkpoint-dir" in err and "--resume" not in err
