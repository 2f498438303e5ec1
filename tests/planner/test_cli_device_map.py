"""A plan whose device map names a device its cluster does not have (a hand-edited plan) is
refused with one line and exit code 2 by every command that reads a plan, instead of a traceback
from the launch export; a plan whose map fits its cluster launches as mapped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api
from planner.schemas import DeviceMap, Layout, TrainingSpec
from planner.schemas.errors import SchemaError

MODEL, CLUSTER = "tiny-gpt", "dgx-a100-80g:4"  # 32 devices, 8 per node
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)
SWAPPED = DeviceMap(devices=tuple(range(16, 32)) + tuple(range(16)))
"""Ranks 0-15 on nodes 2 and 3, ranks 16-31 on nodes 0 and 1."""


def run(args: list[str]) -> tuple[int, str, str]:
    """The console script as a user runs it: real exit codes and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return proc.returncode, proc.stdout, proc.stderr


def _plan(tmp_path: Path) -> Path:
    """dp32 of tiny-gpt on 4 nodes with ``SWAPPED`` as its device map."""
    layout = Layout(
        data_parallel_degree=32,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        device_map=SWAPPED,
    )
    model, cluster = api.load_model(MODEL), api.load_cluster(CLUSTER)
    est = api.estimate(model, cluster, TRAINING, layout)
    path = tmp_path / "plan.json"
    api.save_plan(api.make_plan(model, TRAINING, cluster, CLUSTER, layout, est), path)
    return path


def _on_two_nodes(plan: Path) -> Path:
    """The plan edited by hand to name a cluster of 2 nodes (16 devices) while its map still names
    devices up to 31."""
    raw = json.loads(plan.read_text())
    raw["cluster"].update(spec="dgx-a100-80g:2", num_nodes=2, world_size=16)
    edited = plan.with_name("two_nodes.json")
    edited.write_text(json.dumps(raw))
    return edited


def test_a_plan_whose_map_fits_its_cluster_launches_as_mapped(tmp_path: Path) -> None:
    code, out, err = run(["launch", str(_plan(tmp_path))])
    assert code == 0, err
    assert "# node 0: ranks 16-23" in out.splitlines()  # under the line on setting MASTER_ADDR


@pytest.mark.parametrize(
    "command",
    [["launch", "{plan}"], ["estimate", "--plan", "{plan}"], ["explain", "{plan}"], ["run", "{plan}", "--dry-run"]],
)
def test_a_map_naming_a_device_the_cluster_lacks_is_refused_in_one_line(tmp_path: Path, command: list[str]) -> None:
    edited = _on_two_nodes(_plan(tmp_path))
    code, out, err = run([part.format(plan=edited) for part in command])
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (
        f"{edited}: not a valid plan: layout.device_map names device 31, but cluster 'dgx-a100-80g' "
        "(dgx-a100-80g:2) has 16 devices (0..15)" in err
    )


def test_a_layout_without_a_map_but_more_ranks_than_devices_is_refused(tmp_path: Path) -> None:
    raw = json.loads(_plan(tmp_path).read_text())
    raw["layout"]["device_map"] = {"devices": []}
    raw["cluster"].update(spec="dgx-a100-80g:2", num_nodes=2, world_size=16)
    edited = tmp_path / "identity.json"
    edited.write_text(json.dumps(raw))
    with pytest.raises(SchemaError, match=r"layout has 32 ranks, but cluster 'dgx-a100-80g' \(dgx-a100-80g:2\) has 16"):
        api.load_plan(edited)
