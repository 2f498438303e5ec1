"""``planner.flows.replan``: the plan an elastic restart runs on fewer ranks, searched and written
beside the checkpoints; and ``planner run --elastic`` without a checkpoint folder refused."""

from pathlib import Path

import pytest
from conftest import cpu_cluster
from harness import planner_main

from planner import api
from planner.files.clusters import load_cluster, save_cluster
from planner.flows.replan import plan_for_world, plan_path
from planner.schemas import DType, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import SearchSettings

TRAINING = TrainingSpec(global_batch_size=12, seq_len=32, dtype=DType.FP32)


@pytest.fixture
def plan4(tmp_path: Path) -> Path:
    save_cluster(cpu_cluster(4), tmp_path / "cluster.json")
    plan = api.search("tiny-gpt", str(tmp_path / "cluster.json"), TRAINING, SearchSettings(top_k=1))[0]
    api.save_plan(plan, tmp_path / "plan.json")
    return tmp_path / "plan.json"


def test_three_ranks_get_a_plan_of_the_first_three_devices_the_same_each_time(plan4: Path, tmp_path: Path) -> None:
    old = api.load_plan(plan4)
    new, path = plan_for_world(old, 3, tmp_path / "ckpt")
    assert path == plan_path(tmp_path / "ckpt", 3) == tmp_path / "ckpt" / "plans" / "world-3.json"
    assert api.load_plan(path) == new
    assert new.cluster.world_size == 3 and new.layout.world_size == 3
    assert new.training == old.training and new.model == old.model
    survivors = load_cluster(new.cluster.spec)  # the plan names the profile written beside it
    assert (survivors.devices_per_node, survivors.name) == (3, "cpu-test-first-3")
    again, _ = plan_for_world(old, 3, tmp_path / "ckpt")
    assert again.layout == new.layout  # a restart on the same ranks runs the same layout
    assert sorted(p.name for p in path.parent.iterdir()) == ["world-3.cluster.json", "world-3.json"]


def test_a_world_the_cluster_cannot_hold_is_refused(plan4: Path, tmp_path: Path) -> None:
    with pytest.raises(InfeasibleConfigError, match="5 ranks do not fit"):
        plan_for_world(api.load_plan(plan4), 5, tmp_path / "ckpt")


def test_elastic_without_a_checkpoint_folder_is_refused_in_one_line(
    plan4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    code, _, err = planner_main(["run", str(plan4), "--elastic"], monkeypatch)
    assert code == 2
    assert err.strip() == (
        "error: --elastic resumes each restart from a checkpoint: give their folder with --checkpoint-dir"
    )
