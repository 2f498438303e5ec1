"""Rank-to-device mapping by node order: ``DeviceMappingRefiner`` places whole nodes' worth of
consecutive ranks so that neighbouring rank blocks (which share data-parallel and pipeline
traffic in rank order) sit on nodes joined by the fastest measured links (``refiner``).

First step of issue 16's mapping refiner: nodes are ordered by a greedy chain over the node
bandwidth matrix (start at each node, always step to the unvisited node with the fastest link
from the last one), each order is turned into a device map that keeps every node's devices in
local order, and the Evaluator judges: the fastest map is kept only when it is priced faster than
the candidate's. Uniform node links skip at once (every node order is the identity's equal).
Links are read through ``LinkMatrix.link`` only.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

from planner.schemas import DeviceMap
from planner.schemas.cluster import LinkMatrix
from planner.schemas.errors import InfeasibleConfigError
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Budget, Candidate

MAX_STARTS = 8
"""Greedy chains tried from at most this many start nodes (0, then evenly spaced)."""


def greedy_node_chain(links: LinkMatrix, start: int) -> tuple[int, ...]:
    """Nodes in the order a walk from ``start`` meets them, always stepping over the fastest link
    (highest bandwidth, then lowest latency, then lowest node) to a node not yet visited."""
    order, left = [start], set(range(links.size)) - {start}
    while left:
        last = order[-1]
        step = min(left, key=lambda n: _link_key(links, last, n))
        order.append(step)
        left.remove(step)
    return tuple(order)


def _link_key(links: LinkMatrix, src: int, dst: int) -> tuple[float, float, int]:
    link = links.link(src, dst)
    return (-link.bandwidth_bytes_per_s, link.latency_s, dst)


def node_order_map(order: tuple[int, ...], devices_per_node: int) -> DeviceMap:
    """The device map that runs rank block ``b`` (ranks b*d .. b*d+d-1) on node ``order[b]``."""
    return DeviceMap(devices=tuple(n * devices_per_node + local for n in order for local in range(devices_per_node)))


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
        if links.uniform is not None or links.size < 2 or not layout.device_map.is_identity:
            return candidate
        if layout.world_size != evaluate.cluster.world_size:
            return candidate
        best = candidate
        starts = sorted({k * links.size // MAX_STARTS for k in range(MAX_STARTS)})
        for start in starts:
            device_map = node_order_map(greedy_node_chain(links, start), evaluate.cluster.devices_per_node)
            if device_map.is_identity:
                continue
            try:
                est = evaluate(replace(layout, device_map=device_map))
            except InfeasibleConfigError:
                continue
            if est.step_time_s < best.estimate.step_time_s:
                best = Candidate(replace(layout, device_map=device_map), est)
        return best
