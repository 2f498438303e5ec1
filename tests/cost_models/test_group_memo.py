"""A search's memos change no estimate: on clusters of mixed nodes, each axis's groups sorted
through ``AxisGroups``' memo (and its array pass) are those the plain listing gives, and
estimates of a sample of layouts in search order, devices remapped or not, equal the estimates
of the same layouts priced from empty memos, there and on a cluster whose node matrix is
explicit (every group priced, the slowest collective memoized: ``comm.slowest_collective_s``)."""

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import comm
from cost_models import groups as grp
from cost_models.estimate import estimate
from cost_models.memo import clear_every_memo
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import ClusterProfile, DeviceMap, Layout, TrainingSpec
from planner.schemas.cluster import LinkMatrix, NodeOverride
from planner.schemas.errors import InfeasibleConfigError
from planner.search_engine.space import SearchSpace

MIXED = load_cluster("dgx-a100-80g:2+dgx-h100:2")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=2048)


def _matrix(size: int, low: float, high: float, seed: int) -> LinkMatrix:
    """A symmetric matrix of seeded bandwidths in [low, high] bytes/s, 5 us latency."""
    rng = np.random.default_rng(seed)
    bandwidth = rng.uniform(low, high, (size, size))
    bandwidth = (bandwidth + bandwidth.T) / 2
    np.fill_diagonal(bandwidth, 0.0)
    rows = tuple(map(tuple, bandwidth.tolist()))
    return LinkMatrix(size=size, bandwidth_bytes_per_s=rows, latency_s=((5e-6,) * size,) * size)


def _explicit(cluster: ClusterProfile) -> ClusterProfile:
    """``cluster`` as a profile measures it: every node pair's link its own, one node's devices too."""
    per_node = cluster.devices_per_node
    return cluster.model_copy(
        update={
            "inter_node_links": _matrix(cluster.num_nodes, 5e9, 25e9, seed=0),
            "node_overrides": (NodeOverride(nodes=(1,), intra_node_links=_matrix(per_node, 50e9, 150e9, seed=1)),),
        }
    )


EXPLICIT = _explicit(load_cluster("dgx-h100:4"))


def _sample(model_name: str, count: int) -> list[Layout]:
    """``count`` layouts of the search space in search order; every third with its ranks
    shuffled over the devices, every third with whole nodes swapped."""
    model = load_model(model_name)
    space = SearchSpace(
        model=model, training=TRAINING, world_size=MIXED.world_size, devices_per_node=MIXED.devices_per_node
    )
    rng = random.Random(0)
    layouts = sorted(rng.sample(range(space.size()), count))
    picked = [layout for i, layout in enumerate(space.candidates()) if i in set(layouts)]
    shuffled = list(range(MIXED.world_size))
    rng.shuffle(shuffled)
    per_node = MIXED.devices_per_node
    swapped = [((r // per_node + 1) % MIXED.num_nodes) * per_node + r % per_node for r in range(MIXED.world_size)]
    maps = (None, DeviceMap(devices=tuple(shuffled)), DeviceMap(devices=tuple(swapped)))
    return [
        layout if maps[i % 3] is None else replace(layout, device_map=maps[i % 3]) for i, layout in enumerate(picked)
    ]


def _axes(layout: Layout) -> list[comm.AxisGroups]:
    p, g = layout.pipeline_parallel_degree, layout.shard_degree
    per_stage = [f(layout, s) for s in range(p) for f in (grp.data_groups, grp.context_groups, grp.expert_data_groups)]
    sizes = [grp.sharding_groups(layout, s, g) for s in range(p)] + [grp.replica_groups(layout, s, g) for s in range(p)]
    whole = [f(layout) for f in (grp.tensor_groups, grp.expert_groups, grp.pipeline_groups, grp.data_groups)]
    return whole + per_stage + sizes


@pytest.mark.parametrize("model_name", ["llama3-8b", "mixtral-8x7b"])
def test_memoized_groups_are_the_plain_listings(model_name: str) -> None:
    for layout in _sample(model_name, 40):
        for axis in _axes(layout):
            for rank_order in (True, False):
                assert comm.priced_groups(axis, MIXED, rank_order=rank_order) == comm.priced_groups(
                    list(axis), MIXED, rank_order=rank_order
                ), (layout.describe(), axis.key[0])


@pytest.mark.parametrize("cluster", [MIXED, EXPLICIT], ids=["mixed", "explicit"])
@pytest.mark.parametrize("model_name", ["llama3-8b", "mixtral-8x7b"])
def test_estimates_in_search_order_equal_estimates_from_empty_memos(model_name: str, cluster: ClusterProfile) -> None:
    model = load_model(model_name)
    layouts = _sample(model_name, 60)

    def priced(layout: Layout) -> object:
        try:
            return estimate(model, TRAINING, cluster, layout)
        except InfeasibleConfigError as e:
            return str(e)

    warm = [priced(layout) for layout in layouts]
    cold = []
    for layout in layouts:
        clear_every_memo()
        comm._priced_axis.cache_clear()
        cold.append(priced(layout))
    assert sum(not isinstance(w, str) for w in warm) >= 10  # enough of them fit to mean something
    assert warm == cold


def test_equal_priced_groups_are_one_object_hashed_once() -> None:
    """The memos key on an axis's priced groups: equal ones are one object (a hit then compares
    identities, not hundreds of groups), equal to and hashed as the plain tuple."""
    groups = [comm.Group(range(start, start + 64, 8)) for start in range(8)]
    first, again = comm.PricedGroups.of(groups), comm.PricedGroups.of(list(groups))
    assert first is again
    assert first == tuple(groups) and hash(first) == hash(tuple(groups))
    assert comm.PricedGroups.of(groups[:4]) is not first


@settings(max_examples=80, deadline=None)
@given(
    groups=st.integers(1, 12),
    size=st.integers(1, 9),
    per_node=st.sampled_from([1, 2, 4, 8]),
    nodes=st.integers(1, 6),
    kinds=st.integers(1, 3),
    by_count=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_the_array_pass_finds_the_spreads_the_plain_loop_finds(
    groups: int, size: int, per_node: int, nodes: int, kinds: int, by_count: bool, seed: int
) -> None:
    # Random groups over random devices (members of one group distinct), nodes of random classes:
    # the first group of each spread is the same, in the same order, found on arrays or by the loop.
    rng = np.random.default_rng(seed)
    world = per_node * nodes
    size = min(size, world)
    devices = np.stack([rng.choice(world, size, replace=False) for _ in range(groups)])
    devices = np.concatenate([devices, devices[rng.integers(0, groups, groups)]])  # repeats: one spread each
    classes = tuple(int(c) for c in rng.integers(0, kinds, nodes))
    plain = comm._representatives(
        [comm.Group(tuple(int(d) for d in row)) for row in devices], False, classes, per_node, by_count
    )
    rows = comm.spread_rows(devices, per_node, np.asarray(classes, dtype=np.int64), by_count)
    assert tuple(comm.Group(tuple(int(d) for d in devices[i])) for i in comm.first_rows(rows)) == plain
