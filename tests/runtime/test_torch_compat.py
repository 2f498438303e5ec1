"""The torch releases the runtime supports, and the APIs that moved between them
(``runtime.torch_compat``): the collectives that stand in for each other, process groups that
keep a mesh's order where torch can build them (and a one-line refusal where it cannot), and the
refusal of a torch outside the range. The tests marked ``torch_oldest`` also run under torch 2.11
(``scripts/torch_oldest_venv.sh``)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import planner_main, run_ranks

from planner.schemas import DeviceMap, Layout
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import MeshAxis, coordinates
from runtime import layout_mesh
from runtime.collective_clock import CollectiveClock
from runtime.torch_compat import (
    NEW_GROUP_KEEPS_ORDER,
    SUPPORTED_TORCH,
    UnsupportedTorchError,
    all_gather_single,
    check_torch_version,
    reduce_scatter_single,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_cli import _local_plan, _torchrun_env


@pytest.mark.torch_oldest
@pytest.mark.parametrize("version", ["2.11.0", "2.11.0+cu130", "2.12.1", "2.13.0+cpu", "2.13.1a0+git1234"])
def test_the_supported_range_is_accepted(version: str) -> None:
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.10.2", "2.14.0.dev20260101", "1.13.1", "3.0.0"])
def test_a_torch_outside_the_range_is_refused_naming_it_and_the_range(version: str) -> None:
    with pytest.raises(UnsupportedTorchError, match=rf"torch {version} is not supported: .* torch 2\.11 through 2\.13"):
        check_torch_version(version)


def test_the_torch_of_this_suite_is_in_the_range() -> None:
    check_torch_version(str(torch.__version__))
    assert SUPPORTED_TORCH[0] <= SUPPORTED_TORCH[1]


def test_an_unreadable_version_is_refused() -> None:
    with pytest.raises(UnsupportedTorchError, match="cannot read torch's version 'nightly'"):
        check_torch_version("nightly")


@pytest.mark.torch_oldest
@pytest.mark.parametrize("command", ["run", "profile"])
def test_run_and_profile_refuse_an_unsupported_torch_with_exit_2(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any work (no process group: the launcher's environment has no rendezvous)."""
    _torchrun_env(monkeypatch, rank=0, world=4)
    monkeypatch.setattr(torch, "__version__", "2.10.0")
    args = ["run", str(_local_plan(tmp_path)), "--steps", "1"] if command == "run" else ["profile", "--quick"]
    code, _, err = planner_main(args, monkeypatch, cwd=tmp_path)
    assert code == 2, err
    assert "torch 2.10.0 is not supported" in err and "2.11 through 2.13" in err and "Traceback" not in err


def _collectives() -> dict[str, object]:
    """On 2 ranks: this rank's gather and reduce-scatter, and what the collective clock saw."""
    me = dist.get_rank()
    shard = torch.tensor([float(me), 10.0 + me])
    gathered = torch.empty(4)
    clock = CollectiveClock()
    with clock.running():
        all_gather_single(gathered, shard, group=None)
        summed = torch.empty(2)
        reduce_scatter_single(summed, torch.arange(4, dtype=torch.float32) * (me + 1), group=None)
    return {"gathered": gathered.tolist(), "summed": summed.tolist(), "timed": clock.inside_s > 0}


@pytest.mark.torch_oldest
@pytest.mark.distributed
def test_gather_and_reduce_scatter_concatenate_in_rank_order_and_are_timed(tmp_path: Path) -> None:
    result = run_ranks(2, _collectives, workdir=tmp_path)
    assert result["gathered"] == [0.0, 10.0, 1.0, 11.0]
    assert result["summed"] == [0.0, 3.0]  # rank 0's half of arange(4) * 1 + arange(4) * 2
    assert result["timed"]


TRANSPOSED = (0, 2, 1, 3)
"""Plan ranks 1 and 2 swap devices: every mesh axis still lists its devices in increasing order."""
OUT_OF_ORDER = (1, 0, 3, 2)
"""The tp axis lists its devices [1, 0]: only a group that keeps its order can build it."""


def _mapped_meshes() -> dict[str, object]:
    """On 4 ranks: each map's coordinates of this process and a tp gather's order, or the refusal."""
    me, out = dist.get_rank(), {}
    for devices in (TRANSPOSED, OUT_OF_ORDER):
        layout = Layout(
            data_parallel_degree=2,
            tensor_parallel_degree=2,
            pipeline_parallel_degree=1,
            micro_batch_size=1,
            device_map=DeviceMap(devices=devices),
        )
        try:
            mesh = layout_mesh(layout, "cpu")
        except InfeasibleConfigError as e:
            out[str(devices)] = str(e)
            continue
        plan_rank = devices.index(me)
        shard = torch.full((1,), float(plan_rank))
        gathered = torch.empty(2)
        all_gather_single(gathered, shard, group=mesh[MeshAxis.TP].get_group())
        placed = tuple(mesh.get_coordinate() or ()) == coordinates(layout, plan_rank)
        replica = coordinates(layout, plan_rank)[1]
        out[str(devices)] = placed and gathered.tolist() == [float(2 * replica), float(2 * replica + 1)]
    return out


@pytest.mark.torch_oldest
@pytest.mark.distributed
def test_device_mapped_meshes_get_the_plans_groups_or_are_refused(tmp_path: Path) -> None:
    """A map in rank order on every axis builds on any supported torch; one out of order builds
    where ``new_group`` keeps the order given (2.13) and is refused in one line where it sorts (2.11)."""
    result = run_ranks(4, _mapped_meshes, workdir=tmp_path)
    assert result[str(TRANSPOSED)] is True
    if NEW_GROUP_KEEPS_ORDER:
        assert result[str(OUT_OF_ORDER)] is True
    else:
        refusal = result[str(OUT_OF_ORDER)]
        assert isinstance(refusal, str) and "[1, 0]" in refusal and "torch 2.13" in refusal
