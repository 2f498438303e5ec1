"""Time of the device-mapping refiner's node ordering (``device_mapping.greedy_node_chain``) on
clusters of 128, 1,024 and 4,096 nodes whose node bandwidth matrices are random but seeded
(uniform 5-25 GB/s, symmetric). The refiner walks ``MAX_STARTS`` chains; this times one.

Run: python benchmarks/mapping_speed.py [nodes ...]
"""

import sys
import time

import numpy as np

from planner.schemas.cluster import LinkMatrix
from planner.search_engine.device_mapping import MAX_STARTS, greedy_node_chain


def random_links(nodes: int, *, seed: int = 0) -> LinkMatrix:
    """A symmetric node matrix with seeded bandwidths in 5-25 GB/s and 5 us latency."""
    rng = np.random.default_rng(seed)
    bandwidth = rng.uniform(5e9, 25e9, (nodes, nodes))
    bandwidth = (bandwidth + bandwidth.T) / 2
    latency = np.full((nodes, nodes), 5e-6)
    return LinkMatrix(
        size=nodes,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple(map(tuple, latency.tolist())),
    )


def main(sizes: list[int]) -> None:
    for nodes in sizes:
        links = random_links(nodes)
        start = time.perf_counter()
        greedy_node_chain(links, 0)
        chain_s = time.perf_counter() - start
        total_s = chain_s * MAX_STARTS
        print(f"{nodes:>5} nodes x 8 devices: one chain {chain_s:.2f} s, {MAX_STARTS} chains ~{total_s:.1f} s")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [128, 1024, 4096])
