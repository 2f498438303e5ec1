"""`planner cluster cut`: a measured profile cut to its first N ranks, for `replan --cluster`."""

from pathlib import Path

import pytest
from conftest import cpu_cluster, make_cluster
from harness import planner_main
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import load_cluster, save_cluster
from planner.flows.replan import survivor_core_share, survivors


def test_fewer_cpu_ranks_on_a_node_share_its_cores_less() -> None:
    assert survivor_core_share(0.5, 4, 3) == 2 / 3  # 4 ranks on 2 cores, then 3
    assert survivor_core_share(0.5, 4, 2) == 1.0  # a core each
    assert survivor_core_share(1.0, 8, 2) == 1.0  # accelerators: always their own
    shared = cpu_cluster(4)
    shared = shared.model_copy(update={"device": shared.device.model_copy(update={"core_share": 0.5})})
    assert survivors(shared, 3).device.core_share == 2 / 3
    several = make_cluster(nodes=2, per_node=4)
    several = several.model_copy(update={"device": several.device.model_copy(update={"core_share": 0.5})})
    assert survivors(several, 4).device.core_share == 0.5  # whole nodes: as many ranks on each as before


def test_cut_writes_the_first_ranks_and_replan_plans_on_them(tmp_path: Path) -> None:
    cluster = cpu_cluster(4)
    cluster = cluster.model_copy(update={"device": cluster.device.model_copy(update={"core_share": 0.5})})
    save_cluster(cluster, tmp_path / "cluster.json")
    cut = CliRunner().invoke(
        app, ["cluster", "cut", str(tmp_path / "cluster.json"), "--ranks", "2", "--output", str(tmp_path / "s.json")]
    )
    assert cut.exit_code == 0, cut.output
    survivors_profile = load_cluster(str(tmp_path / "s.json"))
    assert (survivors_profile.world_size, survivors_profile.device.core_share) == (2, 1.0)
    assert survivors_profile.name == "cpu-test-first-2"
    plan, new = tmp_path / "plan.json", tmp_path / "plan-2.json"
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--global-batch-size", "8"]
    assert CliRunner().invoke(app, [*search, "--seq-len", "32", "--output", str(plan)]).exit_code == 0
    replanned = CliRunner().invoke(
        app, ["replan", str(plan), "--cluster", str(tmp_path / "s.json"), "--output", str(new)]
    )
    assert replanned.exit_code == 0, replanned.output
    assert new.is_file()


def test_cut_refuses_a_part_node_of_several_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_cluster(make_cluster(nodes=2, per_node=4), tmp_path / "cluster.json")
    args = ["cluster", "cut", str(tmp_path / "cluster.json"), "--ranks", "6", "--output", str(tmp_path / "s.json")]
    code, _, err = planner_main(args, monkeypatch)
    assert code == 2 and "not whole nodes" in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.json").exists()
