"""Rank-to-device mapping by node order: ``DeviceMappingRefiner`` places whole nodes' worth of
consecutive ranks so that neighbouring rank blocks (which share data-parallel and pipeline
traffic in rank order) sit on nodes joined by the fastest measured links (``refiner``).

The first of the two mapping refiners: nodes are ordered by a greedy chain over the node
bandwidth matrix (start at each of a few nodes, always step to the unvisited node with the
fastest link from the last one), each order is turned into a device map that keeps every node's
devices in local order, and the Evaluator judges: the fastest map is kept only when it is priced
faster than the candidate's. On up to ``SWAP_NODES`` nodes the best order is then improved by
pair swaps the Evaluator prices faster. Uniform node links, measured ones that differ by no more
than their measurement's noise (``distinct_links``), and clusters beyond ``MAX_NODES``, skip at
once. Devices inside a node keep their order here; the next refiner,
``intra_node_mapping.IntraNodeMappingRefiner``, permutes them per node so that tensor-parallel
groups take the node's fastest links, composed with the order chosen here. Links are read
through the node matrix's arrays (``LinkMatrix.arrays``, which agree with ``LinkMatrix.link`` on
every pair).
"""

import itertools
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from cost_models.memo import HeldMemo
from planner.schemas import DeviceMap, Layout, LinkMatrix
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Candidate


def maps_devices(evaluate: Evaluator, layout: Layout) -> bool:
    """Whether the training's stack runs ``layout`` with its ranks on other devices than the
    launcher numbers them (``Evaluator.admits``; no export target does): the mapping refiners ask
    before they price any map, since every map they would find is refused otherwise."""
    n = layout.world_size
    return n > 1 and evaluate.admits(replace(layout, device_map=DeviceMap(devices=(1, 0, *range(2, n)))))


MAX_STARTS = 8
"""Greedy chains tried from at most this many start nodes (0, then evenly spaced)."""
SWAP_NODES = 16
"""Up to this many nodes the best chain is then improved by swapping pairs of nodes while the
Evaluator prices a swap faster (a chain sees only each next hop: a pipeline's boundaries and its
stages' data-parallel rings pull the order different ways)."""
MAX_NODES = 4096
"""Clusters of more nodes keep the identity. Up to here the whole refiner (its chains and the
Evaluator pricing each order) takes seconds, most of it the Evaluator's
(benchmarks/mapping_speed.py times it); and the node matrix's arrays hold 16 bytes per node
pair (268 MB at 4,096 nodes), growing with the square beyond."""


def greedy_node_chain(links: LinkMatrix, start: int) -> tuple[int, ...]:
    """Nodes in the order a walk from ``start`` meets them, always stepping over the fastest link
    (highest bandwidth, then lowest latency, then lowest node) to a node not yet visited.

    Each step scans the last node's row of the matrix's arrays (``LinkMatrix.arrays``) at once,
    visited nodes masked out: n steps of one row each, 0.1 s at 4,096 nodes; memoized per matrix,
    as every finalist of a search walks the same chains."""
    return _CHAINS.get(links, (start,), lambda: _greedy_node_chain(links, start))


_CHAINS: HeldMemo[tuple[int, ...]] = HeldMemo(limit=64)


def _greedy_node_chain(links: LinkMatrix, start: int) -> tuple[int, ...]:
    arrays = links.arrays()
    bandwidth, latency = arrays.bandwidth_bytes_per_s, arrays.latency_s
    visited = np.zeros(links.size, dtype=bool)
    order = [start]
    visited[start] = True
    for _ in range(links.size - 1):
        row = np.where(visited, -np.inf, bandwidth[order[-1]])
        fastest = np.flatnonzero(row == row.max())  # ascending: the lowest node first
        if len(fastest) > 1:
            row_latency = latency[order[-1], fastest]
            fastest = fastest[row_latency == row_latency.min()]
        step = int(fastest[0])
        order.append(step)
        visited[step] = True
    return tuple(order)


def node_order_map(order: tuple[int, ...], devices_per_node: int) -> DeviceMap:
    """The device map that runs rank block ``b`` (ranks b*d .. b*d+d-1) on node ``order[b]``."""
    return DeviceMap(devices=tuple(n * devices_per_node + local for n in order for local in range(devices_per_node)))


def distinct_links(links: LinkMatrix) -> bool:
    """Whether links (a node's, or those between nodes) differ by more than their measurement's
    noise: not a uniform link,
    and, where the bandwidths were measured (``LinkMatrix.bandwidth_spread``), the fastest and
    slowest pair differ by more than the median spread (interquartile range / median) of the
    repeats. Within it, which pair is faster is noise, and a map chosen by it gains nothing when
    run: on a CPU node (one shared memory), maps priced faster ran slower than their prediction
    (``benchmarks/tune_local.py``). Such a node's pairs can also differ by more than their spread
    with nothing to place by, as every pair is the same loopback through one memory: the
    intra-node refiner leaves CPU nodes alone too.
    The node-order refiner reads it of the node matrix: nodes whose links differ within their
    noise keep their order."""
    if links.uniform is not None:
        return False
    if links.bandwidth_spread is None:
        return True
    bandwidth = links.arrays().bandwidth_bytes_per_s
    off = ~np.eye(links.size, dtype=bool)
    spread = np.asarray(links.bandwidth_spread, dtype=np.float64)[off]
    fastest, slowest = float(bandwidth[off].max()), float(bandwidth[off].min())
    return (fastest - slowest) / fastest > float(np.median(spread))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMappingRefiner:
    """Moves a finalist's rank blocks onto nodes in a greedy fastest-link order when the Evaluator
    prices that faster; identity-mapped finalists on uniform node links are returned untouched."""

    name: ClassVar[str] = "device-mapping"

    def refine(self, candidate: Candidate, evaluate: Evaluator, budget: Budget, *, seed: int) -> Candidate:
        """The candidate with the fastest greedy node order as its device map, when faster."""
        del budget, seed  # no solver yet: a handful of evaluations
        links = evaluate.cluster.inter_node_links
        layout = candidate.layout
        if not distinct_links(links) or not 2 <= links.size <= MAX_NODES or not layout.device_map.is_identity:
            return candidate
        if layout.world_size != evaluate.cluster.world_size or not maps_devices(evaluate, layout):
            return candidate
        per_node = evaluate.cluster.devices_per_node
        best, best_order = candidate, tuple(range(links.size))
        starts = sorted({k * links.size // MAX_STARTS for k in range(MAX_STARTS)})
        for start in starts:
            order = greedy_node_chain(links, start)
            found = _priced(evaluate, layout, order, per_node)
            if found is not None and found.estimate.step_time_s < best.estimate.step_time_s:
                best, best_order = found, order
        if links.size > SWAP_NODES:
            return best
        improved = True
        while improved:  # first-improvement pair swaps: each accepted swap is strictly faster, so this ends
            improved = False
            for i, j in itertools.combinations(range(links.size), 2):
                swapped = list(best_order)
                swapped[i], swapped[j] = swapped[j], swapped[i]
                found = _priced(evaluate, layout, tuple(swapped), per_node)
                if found is not None and found.estimate.step_time_s < best.estimate.step_time_s:
                    best, best_order, improved = found, tuple(swapped), True
        return best


def _priced(evaluate: Evaluator, layout: Layout, order: tuple[int, ...], per_node: int) -> Candidate | None:
    """The (identity-mapped) layout with its rank blocks on nodes in ``order``, priced
    (``priced_map``)."""
    return priced_map(evaluate, layout, node_order_map(order, per_node))


def priced_map(evaluate: Evaluator, layout: Layout, device_map: DeviceMap) -> Candidate | None:
    """The layout under ``device_map``, priced; None when that is its own map (already priced) or
    does not fit."""
    if device_map == layout.device_map:
        return None
    mapped = replace(layout, device_map=device_map)
    try:
        return Candidate(mapped, evaluate(mapped))
    except InfeasibleConfigError:
        return None
