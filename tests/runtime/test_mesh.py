"""The runtime's meshes: a layout's mesh puts each plan rank on the process of its device (the
DeviceMap), with every axis's group ordered as the mesh (torch would sort it by rank), and equals
torch's own ``init_device_mesh`` under the identity map."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from cost_models.groups import expert_data_groups, expert_groups, replica_groups, sharding_groups
from planner.schemas import DeviceMap, Layout, ZeroStage
from planner.schemas.geometry import (
    EXPERT_MESH_AXES,
    MESH_AXES,
    SHARDING_MESH_AXES,
    ExpertMeshAxis,
    MeshAxis,
    ShardingMeshAxis,
    coordinates,
)
from runtime import device_grid, group_mesh, layout_mesh
from runtime.mesh import expert_device_grid, sharding_device_grid


def _layout(p: int = 1, **kw: object) -> Layout:
    return Layout(
        data_parallel_degree=2, tensor_parallel_degree=2, pipeline_parallel_degree=p, micro_batch_size=1, **kw
    )  # type: ignore[arg-type]


MAPS = [(2, 3, 0, 1), (1, 0, 3, 2), (3, 1, 2, 0)]
"""Devices of ranks 0..3: dp axis reversed; tp axis reversed; both axes out of order."""


def test_device_grid_holds_each_plan_ranks_device() -> None:
    layout = _layout(device_map=DeviceMap(devices=(2, 3, 0, 1)))
    assert device_grid(layout).tolist() == [[[2, 3], [0, 1]]]
    identity = _layout(2)
    assert device_grid(identity).flatten().tolist() == list(range(8))


def _check_meshes() -> bool:
    """On every rank: the identity mesh is torch's; under each map this process sits at its plan
    rank's coordinates, and a tensor-parallel gather follows the mesh's order."""
    me = dist.get_rank()
    identity = _layout()
    assert layout_mesh(identity, "cpu") == init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    for devices in MAPS:
        layout = _layout(device_map=DeviceMap(devices=devices))
        mesh = layout_mesh(layout, "cpu")
        plan_rank = devices.index(me)
        expected = coordinates(layout, plan_rank)
        assert tuple(mesh.get_coordinate() or ()) == expected, (devices, me)
        assert tuple(mesh[a].get_local_rank() for a in MESH_AXES) == expected, (devices, me)
        shard = torch.full((1,), float(plan_rank))
        gathered = DTensor.from_local(shard, mesh[MeshAxis.TP], [Shard(0)]).full_tensor()
        replica = expected[1]
        assert gathered.tolist() == [float(2 * replica), float(2 * replica + 1)], (devices, me, gathered)
    pair = group_mesh("cpu", dist.get_world_size(), 2, MeshAxis.PP)
    assert pair.get_local_rank() == me % 2 and pair.mesh.tolist() == [me - me % 2, me - me % 2 + 1]
    return True


@pytest.mark.distributed
def test_layout_mesh_places_plan_ranks_on_their_devices(tmp_path: Path) -> None:
    assert run_ranks(4, _check_meshes, workdir=tmp_path) is True


@pytest.mark.parametrize(
    ("d", "t", "p", "ep", "devices"),
    [(4, 1, 1, 2, ()), (4, 2, 2, 2, ()), (8, 1, 1, 4, ()), (4, 2, 1, 4, ()), (4, 1, 1, 2, (3, 1, 0, 2))],
)
def test_expert_mesh_groups_are_the_cost_models(d: int, t: int, p: int, ep: int, devices: tuple[int, ...]) -> None:
    """The runtime's expert mesh and the cost model's expert groups name the same devices: its ep
    axis the expert-parallel groups (runs of ep replicas), its edp axis the expert-data-parallel
    ones (replicas holding the same experts)."""
    layout = Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        expert_parallel_degree=ep,
        device_map=DeviceMap(devices=devices),
    )
    grid = expert_device_grid(layout)
    axis = {name: i for i, name in enumerate(EXPERT_MESH_AXES)}

    def fibers(name: ExpertMeshAxis) -> set[tuple[int, ...]]:
        lines = grid.movedim(axis[name], -1).reshape(-1, grid.shape[axis[name]]).tolist()
        return {tuple(line) for line in lines}

    assert fibers(ExpertMeshAxis.EP) == {tuple(g.devices) for g in expert_groups(layout)}
    assert fibers(ExpertMeshAxis.EDP) == {tuple(g.devices) for g in expert_data_groups(layout)}


@pytest.mark.parametrize(
    ("d", "t", "p", "g", "devices"),
    [(4, 1, 1, 2, ()), (8, 2, 1, 4, ()), (4, 2, 2, 2, ()), (8, 1, 1, 2, ()), (4, 1, 1, 2, (3, 1, 0, 2))],
)
def test_sharding_mesh_groups_are_the_cost_models(d: int, t: int, p: int, g: int, devices: tuple[int, ...]) -> None:
    """The runtime's sharding mesh and the cost model's groups name the same devices: its shard
    axis the sharding groups (runs of g consecutive replicas), its replicate axis the replicas
    holding the same shard (strided by g)."""
    layout = Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
        sharding_group_size=g,
        device_map=DeviceMap(devices=devices),
    )
    grid = sharding_device_grid(layout, g)
    axis = {name: i for i, name in enumerate(SHARDING_MESH_AXES)}

    def fibers(name: ShardingMeshAxis) -> set[tuple[int, ...]]:
        lines = grid.movedim(axis[name], -1).reshape(-1, grid.shape[axis[name]]).tolist()
        return {tuple(line) for line in lines}

    stages = range(p)
    assert fibers(ShardingMeshAxis.SHARD) == {tuple(x.devices) for s in stages for x in sharding_groups(layout, s, g)}
    assert fibers(ShardingMeshAxis.REPLICATE) == {
        tuple(x.devices) for s in stages for x in replica_groups(layout, s, g)
    }
    assert len(fibers(ShardingMeshAxis.SHARD)) == p * t * d // g
