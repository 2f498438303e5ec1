"""A collective over a group spanning nodes, priced from links as NCCL runs it: one ring through
every member, or (all-reduce) a tree across the nodes, whichever is faster.

What NCCL does (``src/graph/search.cc`` and ``src/graph/tuning.cc`` of github.com/NVIDIA/nccl,
read for the model, not copied):

* Ring. Each channel's ring enters a node through one NIC, visits the node's k members over
  NVLink and leaves through a NIC; the channels use different NICs, so with one rail per member
  the node's k rails carry the ring at once. The tuner prices a ring's bus bandwidth as channels
  x per-channel speed, which on a DGX H100 is 8 rails x 48 GB/s: the per-node sum of rails, not
  one rail. Every member still receives, reduces and forwards every byte of the ring, so the
  ring also runs no faster than a ring inside one node (the profile's intra-node figure is that
  achieved bus bandwidth, e.g. 370 of NVLink's 450 GB/s on H100: protocol and copy overhead, not
  the wire): bus bandwidth ``min(k x rail, intra)``. Its latency is one hop per step: all-reduce
  2(n-1) steps of which 2(N-1) cross nodes, all-gather and reduce-scatter n-1 of which N-1 do
  (``nsteps``, ``nInterSteps``), the others over NVLink. Unlike a two-phase (inside the nodes,
  then across them) composition, the ring pipelines both: the slower bound decides, the two
  phases' times do not add.
* Tree (all-reduce only; NCCL has no tree all-gather or reduce-scatter). A chain through the k
  members of each node and a double binary tree across the N nodes: latency
  2((k-1) intra + log2(N) inter) hops, bus bandwidth 0.92 of the rails' (``busBw * .92``), and
  the buffer crosses each link twice (up, then down: algorithm bandwidth = bus bandwidth / 2).
* NCCL's tuner prices both and runs the faster; so does this model.

Per-hop latencies are the profile's links' (the tuner's own constants, e.g. 3.4 us per NVLink
hop and 14 us per network hop for the Simple protocol, are calibrated for its choice, not for a
time; the profile's are measured or derived from measured collectives).

Published figures this model is checked against (``tests/cost_models/test_spanning_collectives.py``):
Azure NDmv4, 2 x 8 A100, 8 HDR 200 Gb/s rails, NCCL 2.17.1 (microsoft/mscclpp,
docs/performance/performance-ndmv4.md): all-gather busbw 177.05 GB/s at 1 GiB and 186.01 at
4 GiB, all-reduce 183.82 and 188.18 (the two-phase composition priced 146 GB/s); NVIDIA's
DGX A100 8 x 200 Gb/s: 192 GB/s all-reduce busbw (NVIDIA/nccl issue #812, AddyLaddy); H100 with
8 x 400 Gb/s: about 380 GB/s multi-node all-reduce busbw without SHARP (GTC 2024 slide quoted in
NVIDIA/nccl issue #1649), 323.5 GB/s all-gather and 330.9 all-reduce on 4 nodes (Voltage Park /
Georgia Tech benchmark), reduce-scatter busbw 360, 345, 320, 300, 280, 260 GB/s on 4 to 128
nodes (NVIDIA/nccl issue #1229; size not stated). Units: bytes, seconds, bytes/s.
"""

import math

from planner.schemas import CollectiveOp, LinkProfile

TREE_BANDWIDTH_FRACTION = 0.92
"""Share of the rails' bus bandwidth NCCL's tuner gives a tree all-reduce (``tuning.cc``)."""


def ring_bus_bandwidth_bytes_per_s(members_per_node: int, intra: LinkProfile, inter: LinkProfile) -> float:
    """Bus bandwidth of one ring through ``members_per_node`` members on each node: the node's
    rails at once (one per member, ``inter`` each), at most that of a ring inside one node
    (``intra``), whose members handle every byte alike; one member a node: its rail."""
    rails_bytes_per_s = members_per_node * inter.bandwidth_bytes_per_s
    if members_per_node == 1:
        return rails_bytes_per_s
    return min(rails_bytes_per_s, intra.bandwidth_bytes_per_s)


def ring_time_s(
    op: CollectiveOp, message_bytes: float, nodes: int, members_per_node: int, intra: LinkProfile, inter: LinkProfile
) -> float:
    """One ring through ``nodes`` x ``members_per_node`` members: a hop of latency per step
    (those crossing nodes at ``inter``'s, the rest at ``intra``'s) plus the ring's volume over its
    bus bandwidth (``ring_bus_bandwidth_bytes_per_s``). ``message_bytes`` is the full buffer."""
    n = nodes * members_per_node
    passes = 2 if op is CollectiveOp.ALL_REDUCE else 1
    steps, inter_steps = passes * (n - 1), passes * (nodes - 1)
    latency_s = (steps - inter_steps) * intra.latency_s + inter_steps * inter.latency_s
    busbw = ring_bus_bandwidth_bytes_per_s(members_per_node, intra, inter)
    return latency_s + op.volume_factor(n) * message_bytes / busbw


def tree_all_reduce_time_s(
    message_bytes: float, nodes: int, members_per_node: int, intra: LinkProfile, inter: LinkProfile
) -> float:
    """NCCL's tree all-reduce: a chain inside each node and a binary tree across ``nodes``, up then
    down; the buffer moves at ``TREE_BANDWIDTH_FRACTION`` of the ring's bus bandwidth, twice."""
    depth = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    latency_s = 2 * ((members_per_node - 1) * intra.latency_s + depth * inter.latency_s)
    busbw = TREE_BANDWIDTH_FRACTION * ring_bus_bandwidth_bytes_per_s(members_per_node, intra, inter)
    return latency_s + 2 * message_bytes / busbw


def spanning_time_s(
    op: CollectiveOp, message_bytes: float, nodes: int, members_per_node: int, intra: LinkProfile, inter: LinkProfile
) -> float:
    """Seconds for all-reduce, all-gather or reduce-scatter over ``nodes`` x ``members_per_node``
    members: the ring, or for all-reduce the faster of ring and tree, as NCCL's tuner picks."""
    ring_s = ring_time_s(op, message_bytes, nodes, members_per_node, intra, inter)
    if op is not CollectiveOp.ALL_REDUCE:
        return ring_s
    return min(ring_s, tree_all_reduce_time_s(message_bytes, nodes, members_per_node, intra, inter))
