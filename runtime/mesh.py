"""Device meshes: the only code of ours that builds a DeviceMesh.

A layout's mesh has the axes ``schemas.geometry.MESH_AXES`` (pp, dp, tp; tp fastest) and puts at
coordinate (s, r, j) the process that plays plan rank ``rank_of(s, r, j)``: the process whose
torch rank is ``layout.device_map.device_of(rank)`` (torchrun numbers processes as the
DeviceMap numbers devices, node by node). With the identity map this is the mesh
``init_device_mesh(device, (p, d, t))`` builds.

Under expert parallelism a second mesh, ``expert_mesh``, splits the data axis into
(edp, ep) (``schemas.geometry.EXPERT_MESH_AXES``) over the same grid of devices; with the experts
folded (``Layout.folds_experts``) it splits each stage's d t ranks, in rank order, into (edp, ep),
its tensor axis of size 1 (``schemas.geometry.expert_rank_of``).

Context parallelism (``Layout.context_parallel_degree``) splits the data axis into (batch, cp)
over the same grid (``schemas.geometry.CONTEXT_MESH_AXES``): ``context_mesh``.

ZeRO in groups (``Layout.sharding_group_size``, HSDP) shards over a (replicate, shard) mesh, the
data axis split into groups of g consecutive ranks (``schemas.geometry.SHARDING_MESH_AXES``),
and a secondary partition (``Layout.secondary_partition_size``) keeps the weights between
forward and backward on such a mesh of groups of s: ``sharding_meshes``.

torch orders the members of a process group by their rank, and a process's place on a mesh
axis is its rank in that axis's group. A map under which some axis lists its devices out of
increasing order would then give processes other coordinates than the plan's (measured on
torch 2.13: a tp axis of devices [1, 0] put device 1's shard second). Such meshes are built on
groups that keep the mesh's order (``torch_compat.new_group_in_order``; torch 2.11 cannot build
them and refuses such a map).
"""

import itertools
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from planner.schemas import Layout
from planner.schemas.geometry import (
    CONTEXT_MESH_AXES,
    EXPERT_MESH_AXES,
    MESH_AXES,
    SHARDING_MESH_AXES,
    MeshAxis,
    ShardingMeshAxis,
    context_mesh_shape,
    expert_mesh_shape,
    expert_rank_of,
    mesh_shape,
    rank_of,
    sharding_mesh_shape,
)
from runtime.torch_compat import new_group_in_order

logger = logging.getLogger(__name__)

GROUPS_AXIS = "groups"
"""Name of the outer axis of ``group_mesh``'s 2-D mesh: which group of consecutive ranks."""


def device_grid(layout: Layout) -> torch.Tensor:
    """The torch rank at each coordinate of ``layout``'s mesh: a (p, d cp, t) int tensor holding
    ``device_map.device_of(rank_of(s, r, j))``."""
    p, d, t = mesh_shape(layout)
    devices = [
        layout.device_map.device_of(rank_of(layout, s, r, j)) for s in range(p) for r in range(d) for j in range(t)
    ]
    return torch.tensor(devices, dtype=torch.int).view(p, d, t)


def layout_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pp, dp, tp) mesh of ``layout`` on this job (every rank calls it, in the same order).

    Args:
        layout: the plan's layout; its DeviceMap says which process plays each plan rank.
        device_type: "cpu" or "cuda" (a torch device's ``type``).

    Returns:
        The mesh; index it by ``MeshAxis`` (``mesh[MeshAxis.TP]``).
    """
    return _mesh(device_grid(layout), device_type, tuple(MESH_AXES), layout)


def expert_device_grid(layout: Layout) -> torch.Tensor:
    """The torch rank at each coordinate of ``layout``'s expert mesh: a (p, edp, ep, t') int
    tensor (``schemas.geometry.expert_mesh_shape``) holding ``device_map.device_of`` the plan
    rank ``expert_rank_of`` gives that coordinate."""
    shape = expert_mesh_shape(layout)
    p, edp, ep, shards = shape
    devices = [
        layout.device_map.device_of(expert_rank_of(layout, s, g, i, j))
        for s in range(p)
        for g in range(edp)
        for i in range(ep)
        for j in range(shards)
    ]
    return torch.tensor(devices, dtype=torch.int).view(shape)


def expert_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pp, edp, ep, tp) mesh of ``layout``'s MoE layers: its mesh with the data axis split
    into expert-data-parallel and expert-parallel axes, every process keeping its coordinates on
    pp and tp; or, with the experts folded, each stage's d t ranks split so, the tp axis of size
    1 (``schemas.geometry.EXPERT_MESH_AXES``). Every rank calls it, in the same order.

    Args:
        layout: the plan's layout; expert_parallel_degree divides ``Layout.expert_ranks``.
        device_type: "cpu" or "cuda".

    Returns:
        The mesh; index it by ``ExpertMeshAxis`` (``mesh[ExpertMeshAxis.EP]``).
    """
    return _mesh(expert_device_grid(layout), device_type, tuple(EXPERT_MESH_AXES), layout)


def context_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pp, batch, cp, tp) mesh of ``layout``: its mesh with the data axis split into (batch,
    cp), every process keeping its coordinates on pp and tp (``schemas.geometry.CONTEXT_MESH_AXES``).
    Every rank calls it, in the same order.

    Returns:
        The mesh; index it by ``ContextMeshAxis`` (``mesh[ContextMeshAxis.CP]``).
    """
    grid = device_grid(layout).view(context_mesh_shape(layout))
    return _mesh(grid, device_type, tuple(CONTEXT_MESH_AXES), layout)


@dataclass(frozen=True, slots=True)
class ShardingMeshes:
    """The meshes ZeRO shares a replica's states over (``sharding_meshes``)."""

    shard: DeviceMesh
    """FSDP's mesh: the 1-D data-parallel mesh, or under sharding groups the 2-D
    (``ShardingMeshAxis.REPLICATE``, ``ShardingMeshAxis.SHARD``) mesh."""
    secondary: DeviceMesh | None = None
    """Under a secondary partition of s ranks: the 2-D (replicate, shard) mesh of groups of s
    consecutive data-parallel ranks ZeRO-3 keeps the weights on after forward."""

    @property
    def shard_group(self) -> DeviceMesh:
        """The 1-D mesh of the ranks that share this rank's states out (its sharding group)."""
        return self.shard if self.shard.ndim == 1 else self.shard[ShardingMeshAxis.SHARD]


def sharding_device_grid(layout: Layout, group_size: int) -> torch.Tensor:
    """The torch rank at each coordinate of ``layout``'s sharding mesh for groups of
    ``group_size``: a (p, d / group_size, group_size, t) int tensor, ``device_grid`` with its data
    axis split (``schemas.geometry.sharding_mesh_shape``)."""
    return device_grid(layout).view(sharding_mesh_shape(layout, group_size))


def split_data_mesh(layout: Layout, device_type: str, group_size: int) -> DeviceMesh:
    """The 2-D (replicate, shard) mesh of this rank's stage and tensor shard: ``layout``'s data
    axis split into groups of ``group_size`` consecutive ranks, sliced from a (pp, replicate,
    shard, tp) mesh of the whole job that every rank builds (call it on every rank, in the same
    order), its devices placed by the DeviceMap as ``layout_mesh`` places them."""
    whole = _mesh(sharding_device_grid(layout, group_size), device_type, tuple(SHARDING_MESH_AXES), layout)
    return whole[ShardingMeshAxis.REPLICATE, ShardingMeshAxis.SHARD]


def sharding_meshes(layout: Layout, device_type: str, dense: DeviceMesh) -> ShardingMeshes:
    """The meshes ZeRO shares ``layout``'s states over (every rank calls it, in the same order):
    ``dense``'s data-parallel mesh, or with ``Layout.sharding_group_size`` g the (replicate,
    shard) mesh of groups of g; with ``Layout.secondary_partition_size`` s the mesh of groups of s.

    Args:
        layout: the plan's layout.
        device_type: "cpu" or "cuda".
        dense: ``layout_mesh(layout, device_type)``, built already.
    """
    g, s = layout.sharding_group_size, layout.secondary_partition_size
    shard = dense[MeshAxis.DP] if g is None else split_data_mesh(layout, device_type, g)
    return ShardingMeshes(shard, None if s is None else split_data_mesh(layout, device_type, s))


def _mesh(grid: torch.Tensor, device_type: str, names: tuple[str, ...], layout: Layout) -> DeviceMesh:
    if all(_increasing(fiber) for axis in range(grid.ndim) for fiber in _fibers(grid, axis)):
        return DeviceMesh(device_type, mesh=grid, mesh_dim_names=names)
    logger.info("mesh of %s: devices out of rank order on some axis; building order-keeping groups", layout.describe())
    return _mesh_of_ordered_groups(grid, device_type, names)


def group_mesh(device_type: str, world_size: int, group_size: int, axis: MeshAxis) -> DeviceMesh:
    """This rank's group of ``group_size`` consecutive ranks as a 1-D mesh named ``axis``: the
    inner axis of a 2-D (groups, axis) mesh over the world, so every group works at once (as a
    layout's tensor-parallel groups do).

    Args:
        device_type: "cpu" or "cuda".
        world_size: ranks of the job; ``group_size`` must divide it.
        group_size: ranks per group.
        axis: the name the group's mesh axis carries.

    Returns:
        The 1-D mesh of this rank's group.
    """
    if world_size % group_size:
        raise ValueError(f"group_size={group_size} must divide world_size={world_size}")
    grid = torch.arange(world_size, dtype=torch.int).view(world_size // group_size, group_size)
    return DeviceMesh(device_type, mesh=grid, mesh_dim_names=(GROUPS_AXIS, axis))[axis]


def _fibers(grid: torch.Tensor, axis: int) -> list[list[int]]:
    """The lines of ``grid`` along ``axis``: the members of each of that axis's groups, in mesh order."""
    lines: list[list[int]] = grid.movedim(axis, -1).reshape(-1, grid.shape[axis]).tolist()
    return lines


def _increasing(ranks: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ranks))


def _mesh_of_ordered_groups(grid: torch.Tensor, device_type: str, names: tuple[str, ...]) -> DeviceMesh:
    """A mesh on groups whose ranks follow the mesh's order along each axis (see the module's
    docstring). Every rank creates every group, in the same order, as ``new_group`` requires."""
    mine = []
    me = dist.get_rank()
    for axis, name in enumerate(names):
        for fiber in _fibers(grid, axis):
            group = new_group_in_order(fiber, group_desc=f"mesh_{name}")
            if me in fiber:
                mine.append(group)
    return DeviceMesh.from_group(mine, device_type, mesh=grid, mesh_dim_names=names)
