"""Rank-to-device mapping inside nodes: ``IntraNodeMappingRefiner`` permutes each node's local
devices so that tensor-parallel groups, then the next mesh axis's members on the node, take the
node's fastest links (``refiner``; the second mapping step, after ``device_mapping``'s node
order).

A node runs a block of ``d`` consecutive ranks (``d`` devices a node); rank slot ``k`` of the block
(rank % d) runs on local device ``perm[k]``. The mesh puts the tensor axis fastest
(``schemas.geometry``), so the slots of a node split into levels of rings: runs of ``t`` slots
(the tensor-parallel groups), then the slots strided by ``t`` (the data axis's members on the
node; the pipeline axis's when the data axis ends inside the node). A collective's ring runs
over its members in rank order and is as fast as its slowest link (``LinkMatrix.ring_slowest``),
so a permutation scores, per level, the slowest bandwidth (then the highest latency) over that
level's rings. Up to ``MAX_EXACT_DEVICES`` devices a node every permutation is scored at once
(8! = 40,320 rows of numpy; a few milliseconds); beyond, the greedy chains of ``device_mapping``
over the node's matrix (cut into the slots in order) are scored instead.

Each distinct intra-node matrix (the cluster default and each override's: nodes described alike
share one permutation) yields the permutations on the Pareto front of its levels' slowest
bandwidths (a step's time falls as either rises; which matters more is the Evaluator's to
judge); the maps they make (the k-th of each matrix's), composed with the node order the
candidate already has, are priced by the Evaluator and the fastest is kept only when it is
priced faster than the candidate. Uniform intra-node links skip at once, without an evaluation,
and so do measured links that differ by no more than their measurement's noise
(``distinct_links``) and CPU nodes, whose local ranks all talk through one memory.
"""

import functools
import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from cost_models.memo import HeldMemo
from planner.schemas import ClusterProfile, DeviceKind, DeviceMap, Layout, LinkMatrix
from planner.schemas.links import FloatArray
from planner.schemas.settings import Budget
from planner.search_engine.device_mapping import MAX_STARTS, distinct_links, greedy_node_chain, maps_devices, priced_map
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Candidate

MAX_EXACT_DEVICES = 8
"""Nodes of up to this many devices have every local permutation scored (8! rows); larger ones
score greedy chains over their matrix."""

MAX_CANDIDATES = 4
"""Local permutations priced per node matrix at most (each map the Evaluator prices is one per
matrix): the Pareto front of the levels' bandwidths rarely has more points."""

IntArray = npt.NDArray[np.intp]


def slot_levels(layout: Layout, devices_per_node: int) -> tuple[IntArray, ...]:
    """The rings of a node's rank slots, per mesh axis from the fastest (at most two levels):
    each level is a (rings, members) array of slots in ring order. An axis joins only where its
    rings tile the node (its stride times its members on the node divide ``devices_per_node``);
    an axis of one member, or whose stride is a whole node or more, has no ring on the node."""
    d = devices_per_node
    levels: list[IntArray] = []
    stride = 1
    for size in (layout.tensor_parallel_degree, layout.dense_replicas, layout.pipeline_parallel_degree):
        if stride >= d or len(levels) == 2:
            break
        members = min(size, d // stride)
        if d % (stride * members):
            break
        if members > 1:
            block = stride * members
            rings = [
                [base + j + stride * i for i in range(members)] for base in range(0, d, block) for j in range(stride)
            ]
            levels.append(np.array(rings, dtype=np.intp))
        stride *= size
    return tuple(levels)


def level_scores(links: LinkMatrix, perms: IntArray, level: IntArray) -> tuple[FloatArray, FloatArray]:
    """Per permutation (a row of ``perms``: slot -> local device), the slowest bandwidth and the
    highest latency over the rings of ``level`` (each ring closing back to its first slot), as
    ``LinkMatrix.ring_slowest`` reads them."""
    arrays = links.arrays()
    src, dst = level.ravel(), np.roll(level, -1, axis=1).ravel()
    a, b = perms[:, src], perms[:, dst]
    return arrays.bandwidth_bytes_per_s[a, b].min(axis=1), arrays.latency_s[a, b].max(axis=1)


@functools.cache
def _all_permutations(devices: int) -> IntArray:
    """Every permutation of ``devices`` local devices, in lexicographic order (the identity first)."""
    perms = np.array(list(itertools.permutations(range(devices))), dtype=np.intp)
    perms.flags.writeable = False
    return perms


def candidate_permutations(links: LinkMatrix, levels: tuple[IntArray, ...]) -> tuple[tuple[int, ...], ...]:
    """The local permutations of a node over ``links`` worth pricing for rings ``levels``: one per
    point of the Pareto front of the levels' slowest bandwidths (no other permutation is at least
    as fast on every level and faster on one), the first level's fastest first; of the
    permutations at one point, the one with the lowest latencies (first level first), then the
    first in lexicographic order (the nearest the identity). At most ``MAX_CANDIDATES``: the two
    ends of the front and points evenly between."""
    d = links.size
    if d <= MAX_EXACT_DEVICES:
        perms = _all_permutations(d)
    else:
        starts = sorted({k * d // MAX_STARTS for k in range(MAX_STARTS)})
        perms = np.array([tuple(range(d))] + [greedy_node_chain(links, s) for s in starts], dtype=np.intp)
    scores = [level_scores(links, perms, level) for level in levels]
    bandwidth = np.stack([bw for bw, _ in scores], axis=1)
    # np.lexsort sorts by its last key first: bandwidths descending, level by level, then latencies.
    keys = [lat for _, lat in reversed(scores)] + [-bandwidth[:, i] for i in reversed(range(len(levels)))]
    order = np.lexsort(keys)
    ranked = bandwidth[order]
    # The first of each run of equal bandwidths in that order (np.unique over rows sorts them all
    # again, through a structured view: most of this function's time over 8! permutations).
    first = np.flatnonzero(np.r_[True, (ranked[1:] != ranked[:-1]).any(axis=1)])
    points, chosen = ranked[first], order[first]
    dominated = [
        bool(((points >= points[i]).all(axis=1) & (points > points[i]).any(axis=1)).any()) for i in range(len(points))
    ]
    front = sorted((i for i in range(len(points)) if not dominated[i]), key=lambda i: (-points[i, 0], int(chosen[i])))
    if len(front) > MAX_CANDIDATES:
        front = [front[round(k * (len(front) - 1) / (MAX_CANDIDATES - 1))] for k in range(MAX_CANDIDATES)]
    return tuple(tuple(int(x) for x in perms[chosen[i]]) for i in front)


_CANDIDATES: HeldMemo[tuple[tuple[int, ...], ...]] = HeldMemo(limit=4096)
"""``candidate_permutations`` by node matrix and levels: a search's finalists share a few slot
levels, and each of a measured cluster's nodes may have its own matrix (8! permutations scored each)."""


def compose(device_map: DeviceMap, world_size: int, devices_per_node: int, perms: IntArray) -> DeviceMap:
    """``device_map`` with each node's local devices permuted: a rank on local device ``k`` of node
    ``n`` moves to local device ``perms[n, k]`` of the same node."""
    old = np.fromiter(device_map.devices or range(world_size), dtype=np.intp, count=world_size)
    node, local = np.divmod(old, devices_per_node)
    return DeviceMap(devices=tuple((node * devices_per_node + perms[node, local]).tolist()))


def _block_mapped(device_map: DeviceMap, world_size: int, devices_per_node: int) -> bool:
    """Whether every node runs one block of consecutive ranks with slot k on local device k (the
    identity, or a node order), so a local permutation means what ``slot_levels`` says."""
    if device_map.is_identity:
        return True
    devices = np.asarray(device_map.devices, dtype=np.intp).reshape(-1, devices_per_node)
    firsts = devices[:, :1]
    return bool((firsts % devices_per_node == 0).all() and (devices == firsts + np.arange(devices_per_node)).all())


def _node_matrices(cluster: ClusterProfile) -> tuple[list[LinkMatrix], IntArray]:
    """The distinct intra-node matrices (the default first, then each override's) and each node's
    index into them."""
    matrices = [cluster.intra_node_links]
    which = np.zeros(cluster.num_nodes, dtype=np.intp)
    for override in cluster.node_overrides:
        if override.intra_node_links is not None:
            matrices.append(override.intra_node_links)
            which[list(override.nodes)] = len(matrices) - 1
    return matrices, which


@dataclass(frozen=True, slots=True, kw_only=True)
class IntraNodeMappingRefiner:
    """Permutes devices inside nodes so that tensor-parallel groups take each node's fastest
    links, when the Evaluator prices that faster; uniform intra-node links return the candidate
    untouched."""

    name: ClassVar[str] = "intra-node-mapping"

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """The candidate with the fastest of a few local permutations composed into its device map,
        when faster."""
        del budget, seed  # a handful of evaluations, no solver
        cluster, layout = evaluate.cluster, candidate.layout
        if cluster.pricing_device.kind is DeviceKind.CPU or layout.world_size != cluster.world_size:
            return candidate  # a CPU host's ranks all talk through its one memory (``distinct_links``)
        matrices, which = _node_matrices(cluster)
        distinct = [distinct_links(m) for m in matrices]
        if not any(distinct):
            return candidate
        d = cluster.devices_per_node
        levels = slot_levels(layout, d)
        if not levels or not _block_mapped(layout.device_map, layout.world_size, d):
            return candidate
        if not maps_devices(evaluate, layout):
            return candidate
        identity = tuple(range(d))
        levels_key = tuple((level.shape, level.tobytes()) for level in levels)
        choices = [
            _CANDIDATES.get(m, levels_key, functools.partial(candidate_permutations, m, levels))
            if keep
            else (identity,)
            for m, keep in zip(matrices, distinct, strict=True)
        ]
        best = candidate
        for k in range(max(len(c) for c in choices)):
            table = np.array([c[min(k, len(c) - 1)] for c in choices], dtype=np.intp)[which]
            found = priced_map(evaluate, layout, compose(layout.device_map, layout.world_size, d, table))
            if found is not None and found.estimate.step_time_s < best.estimate.step_time_s:
                best = found
        return best
