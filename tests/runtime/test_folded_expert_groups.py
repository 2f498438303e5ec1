"""The folded expert mesh the runtime builds (``runtime.mesh.expert_mesh``, experts whole under
tp > 1) has for its ep and edp axes the very groups the cost model prices
(``cost_models.groups.expert_groups`` / ``expert_data_groups``): built for every plan rank on a
fake process group (no peers), the groups each process joins, in order, are the cost model's."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from cost_models.groups import expert_data_groups, expert_groups
from planner.schemas import DeviceMap, Layout
from planner.schemas.geometry import ExpertMeshAxis, MeshAxis
from runtime.mesh import expert_mesh


def _folded(d: int, t: int, p: int, ep: int, devices: tuple[int, ...] = ()) -> Layout:
    return Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        expert_parallel_degree=ep,
        expert_tensor_parallel_degree=1,
        sequence_parallel=True,
        device_map=DeviceMap(devices=devices),
    )


def _joined(layout: Layout) -> dict[ExpertMeshAxis | MeshAxis, set[tuple[int, ...]]]:
    """The groups (processes, in mesh order) each process of ``layout`` joins on each expert-mesh
    axis, read from the mesh built as that process."""
    joined: dict[ExpertMeshAxis | MeshAxis, set[tuple[int, ...]]] = {}
    for process in range(layout.world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=process, world_size=layout.world_size)
        try:
            mesh = expert_mesh(layout, "cpu")
            for axis in (ExpertMeshAxis.EP, ExpertMeshAxis.EDP, MeshAxis.TP):
                members = tuple(mesh[axis].mesh.tolist())
                assert members[mesh[axis].get_local_rank()] == process, (axis, process)
                joined.setdefault(axis, set()).add(members)
        finally:
            dist.destroy_process_group()
    return joined


@pytest.mark.parametrize(
    ("layout", "ep_groups", "edp_groups"),
    [
        # pp2 dp2 tp2 ep2: consecutive pairs of a stage's ranks; the same place of each pair
        (_folded(2, 2, 2, 2), [(0, 1), (2, 3), (4, 5), (6, 7)], [(0, 2), (1, 3), (4, 6), (5, 7)]),
        # pp2 dp2 tp2 ep4: a stage's 4 ranks (both replicas, both shards) exchange tokens
        (_folded(2, 2, 2, 4), [(0, 1, 2, 3), (4, 5, 6, 7)], [(i,) for i in range(8)]),
        # ep1: no exchange; a stage's 4 ranks hold every expert
        (_folded(2, 2, 2, 1), [(i,) for i in range(8)], [(0, 1, 2, 3), (4, 5, 6, 7)]),
        # pp1 dp2 tp2 ep2 under a DeviceMap: the plan ranks' devices, in the plan's order
        (_folded(2, 2, 1, 2, (3, 1, 0, 2)), [(3, 1), (0, 2)], [(3, 0), (1, 2)]),
    ],
)
def test_the_runtimes_folded_expert_groups_are_the_cost_models(
    layout: Layout, ep_groups: list[tuple[int, ...]], edp_groups: list[tuple[int, ...]]
) -> None:
    # the hand-worked groups are the cost model's ...
    assert [tuple(g.devices) for g in expert_groups(layout)] == ep_groups
    assert [tuple(g.devices) for g in expert_data_groups(layout)] == edp_groups
    # ... and the runtime's
    joined = _joined(layout)
    assert joined[ExpertMeshAxis.EP] == set(ep_groups)
    assert joined[ExpertMeshAxis.EDP] == set(edp_groups)
    assert joined[MeshAxis.TP] == {(i,) for i in range(layout.world_size)}  # experts whole: no tensor axis
