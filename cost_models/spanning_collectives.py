"""A collective over a group spanning nodes, priced as NCCL runs it: one ring through every
member, or (all-reduce) a tree across the nodes, each in one of NCCL's three protocols (LL,
LL128, Simple), whichever NCCL's tuner predicts fastest.

What NCCL does (``src/graph/search.cc`` and ``src/graph/tuning.cc`` of github.com/NVIDIA/nccl,
NCCL 2.27.7 to 2.30.7, whose constants used here are the same; read for the model, not copied):

* Ring. Each channel's ring enters a node through one NIC, visits the node's k members over
  NVLink and leaves through a NIC; the channels use different NICs, so with one rail per member
  the node's k rails carry the ring at once. The tuner prices a ring's bus bandwidth as channels
  x per-channel speed, which on a DGX H100 is 8 rails x 48 GB/s: the per-node sum of rails, not
  one rail. Every member still receives, reduces and forwards every byte of the ring, so the
  ring also runs no faster than a ring inside one node (the profile's intra-node figure is that
  achieved bus bandwidth, e.g. 370 of NVLink's 450 GB/s on H100): bus bandwidth
  ``min(k x rail, intra)``. Its latency is one hop per step: all-reduce 2(n-1) steps of which
  2(N-1) cross nodes, all-gather and reduce-scatter n-1 of which N-1 do (``nsteps``,
  ``nInterSteps``), the others over NVLink. The ring pipelines both: the slower bound decides.
* Tree (all-reduce only; NCCL has no tree all-gather or reduce-scatter). A chain through the k
  members of each node and a double binary tree across the N nodes: latency
  2((k-1) intra + floor(log2 N) inter) hops (``log2i``), bus bandwidth 0.92 of the ring's, and
  the buffer crosses each link twice (algorithm bandwidth = bus bandwidth / 2).
* Protocols. LL sends 8-byte lines of 4 data bytes and a flag (half the bandwidth, capped at
  ``llMaxBws``: 39 GB/s on two nodes, 20.4 on more, for Intel hosts); LL128 128-byte lines of
  120 data bytes (0.92 on a ring; 120/128 of the tree's); Simple the whole bandwidth, with a
  fence and a flush per step, so the largest per-hop latency. The tree's LL runs at 1/3.8 of
  its bandwidth. Time of each = base latency + hops x per-hop latency + bytes / bandwidth;
  NCCL runs the least.

  ======================  =====  =====  ======
  tuner constants, us      LL    LL128  Simple
  ======================  =====  =====  ======
  base latency, ring        6.6   14.0    8.4
  base latency, tree        6.8   14.0    8.4
  NVLink hop, ring          0.6    1.9    3.4
  NVLink hop, tree          0.6   1.25    4.0
  network hop, ring         2.7    4.0   14.0
  network hop, tree         5.0    8.5   14.0
  ======================  =====  =====  ======

  With one member per node a ring's network hops take the tree's figures ("latencies are fully
  exposed"); a ring's NVLink hops across nodes take at least the network post overhead (1 us,
  3 for Simple; Intel hosts). A ring's Simple all-reduce across nodes pays 1.4 x its latency
  ("plateau effect", Ampere and later; NCCL applies it once the message exceeds 64 B per
  channel per rank, where LL or LL128 win anyway, so here always). A tree's bandwidth at 64 B to
  256 MiB is scaled by ``treeCorrectionFactor`` (0.4 to 1 by size and protocol: trees "are not
  perfectly sticking to the model for medium sizes").

What comes from where:

* Bandwidth from the profile (measured links), each protocol's share of it from NCCL: the
  share is a property of the protocol's wire format and synchronisation, not of the machine.
* Per-hop latency from NCCL: a ring step is a flag handshake between two GPUs, a smaller and
  different quantity from a profile's link latency (a point-to-point send timed from the host,
  launch included; on the presets the NVLink figure is a whole small all-reduce spread over its
  steps, launch included, which NCCL's base latency already counts once). The network hop adds
  what the profile's inter-node link takes beyond NCCL's own lightest network hop (2.7 us,
  ring LL), as NCCL adds the network plugin's reported latency to every network hop (twice for
  Simple, for the flush; ``graph->latencyInter``): a slower fabric than NCCL's InfiniBand is
  priced slower, and the presets, whose inter-node latency is that 2.7 us, price NCCL's model.
* Not modelled: per-channel bandwidth caps (``perChMaxRingLL128Bws`` and the like: the channel
  count is not in the profile; at 16 channels they exceed what the rails carry), AMD hosts'
  lower LL cap (19-22.5 GB/s) and network overhead (2 us), PCIe-only nodes (NCCL's PCI row
  differs from NVLink's by at most 2.3 us a hop), NVLS, CollNet and PAT.

Published figures this model is checked against (``tests/cost_models/test_spanning_collectives.py``):
Azure NDmv4, 2 x 8 A100, 8 HDR 200 Gb/s rails, NCCL 2.17.1 (microsoft/mscclpp,
docs/performance/performance-ndmv4.md): all-gather busbw 177.05 GB/s at 1 GiB and 186.01 at
4 GiB, all-reduce 183.82 and 188.18 (the two-phase composition priced 146 GB/s), and at 1 KiB
(docs/performance-ndmv4.md before commit 5615e36) all-gather 16.08 us and all-reduce 21.27 us
with one GPU a node, 33.74 and 35.85 us with eight (this model reads 22-31% low: nccl-tests also
times the launch, which NCCL's constants leave out; links' latency per hop read -69% to +49%); NVIDIA's
DGX A100 8 x 200 Gb/s: 192 GB/s all-reduce busbw (NVIDIA/nccl issue #812, AddyLaddy); H100 with
8 x 400 Gb/s: about 380 GB/s multi-node all-reduce busbw without SHARP (GTC 2024 slide quoted in
NVIDIA/nccl issue #1649), 323.5 GB/s all-gather and 330.9 all-reduce on 4 nodes (Voltage Park /
Georgia Tech benchmark), reduce-scatter busbw 360, 345, 320, 300, 280, 260 GB/s on 4 to 128
nodes (NVIDIA/nccl issue #1229; size not stated). Units: bytes, seconds, bytes/s.
"""

import functools
from dataclasses import dataclass
from enum import StrEnum

from planner.schemas import CollectiveOp, LinkProfile


class Algorithm(StrEnum):
    """NCCL's algorithms for a group spanning nodes (without NVLink SHARP or CollNet)."""

    RING = "ring"
    TREE = "tree"


class Protocol(StrEnum):
    """NCCL's protocols: how a step's bytes are synchronised."""

    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolCosts:
    """NCCL's tuner constants of one protocol (``tuning.cc``), in seconds and fractions."""

    protocol: Protocol
    ring_base_s: float
    """Base latency of a ring collective."""
    tree_base_s: float
    """Base latency of a tree all-reduce."""
    ring_nvlink_hop_s: float
    """A ring step over NVLink."""
    tree_nvlink_hop_s: float
    """A tree step over NVLink."""
    ring_net_hop_s: float
    """A ring step over the network, more than one member per node."""
    tree_net_hop_s: float
    """A tree step over the network; also a ring's with one member per node."""
    net_overhead_s: float
    """Least time of a ring's NVLink step when the ring spans nodes (the network post overhead)."""
    plugin_latency_times: int
    """How many times each network hop counts the fabric's latency beyond NCCL's (2: the flush)."""
    ring_share: float
    """Share of the ring's bus bandwidth that carries data."""
    tree_share: float
    """Share of the tree's bus bandwidth (0.92 of the ring's) that carries data."""
    capped: bool
    """Whether the bus bandwidth is at most ``LL_MAX_*`` (LL only)."""
    tree_correction: tuple[float, ...]
    """Tree bandwidth factor by log2(bytes / 64), 64 B to 256 MiB (``treeCorrectionFactor``)."""


US = 1e-6
TREE_BANDWIDTH_FRACTION = 0.92
"""Share of the ring's bus bandwidth NCCL's tuner gives a tree all-reduce (``tuning.cc``)."""
RING_SIMPLE_PLATEAU = 1.4
"""Factor on a ring's Simple all-reduce latency across nodes (Ampere and later)."""
NET_LIGHTEST_HOP_S = 2.7 * US
"""NCCL's network hop of a ring in LL: a profile's inter-node latency beyond it is added per hop."""
LL_MAX_TWO_NODES_BYTES_PER_S = 39.0e9
"""LL's bus bandwidth cap on two nodes (``llMaxBws``, Intel hosts)."""
LL_MAX_MORE_NODES_BYTES_PER_S = 20.4e9
"""LL's bus bandwidth cap on more than two nodes (``llMaxBws``, Intel hosts)."""

# NCCL's treeCorrectionFactor (tuning.cc): a tree's bandwidth factor by log2(bytes / 64), 64 B to 256 MiB.
# fmt: off
_TREE_CORRECTION_LL = (
    1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5,
    .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1,
)
_TREE_CORRECTION_LL128 = (
    1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6,
    .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1,
)
_TREE_CORRECTION_SIMPLE = (
    .9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
    .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
)
# fmt: on

NCCL_PROTOCOLS = (
    ProtocolCosts(
        protocol=Protocol.LL,
        ring_base_s=6.6 * US,
        tree_base_s=6.8 * US,
        ring_nvlink_hop_s=0.6 * US,
        tree_nvlink_hop_s=0.6 * US,
        ring_net_hop_s=2.7 * US,
        tree_net_hop_s=5.0 * US,
        net_overhead_s=1.0 * US,
        plugin_latency_times=1,
        ring_share=0.5,
        tree_share=TREE_BANDWIDTH_FRACTION / 3.8,
        capped=True,
        tree_correction=_TREE_CORRECTION_LL,
    ),
    ProtocolCosts(
        protocol=Protocol.LL128,
        ring_base_s=14.0 * US,
        tree_base_s=14.0 * US,
        ring_nvlink_hop_s=1.9 * US,
        tree_nvlink_hop_s=1.25 * US,
        ring_net_hop_s=4.0 * US,
        tree_net_hop_s=8.5 * US,
        net_overhead_s=1.0 * US,
        plugin_latency_times=1,
        ring_share=0.92,
        tree_share=TREE_BANDWIDTH_FRACTION * 120 / 128,
        capped=False,
        tree_correction=_TREE_CORRECTION_LL128,
    ),
    ProtocolCosts(
        protocol=Protocol.SIMPLE,
        ring_base_s=8.4 * US,
        tree_base_s=8.4 * US,
        ring_nvlink_hop_s=3.4 * US,
        tree_nvlink_hop_s=4.0 * US,
        ring_net_hop_s=14.0 * US,
        tree_net_hop_s=14.0 * US,
        net_overhead_s=3.0 * US,
        plugin_latency_times=2,
        ring_share=1.0,
        tree_share=TREE_BANDWIDTH_FRACTION,
        capped=False,
        tree_correction=_TREE_CORRECTION_SIMPLE,
    ),
)
"""LL, LL128 and Simple as NCCL 2.27.7-2.30.7's tuner prices them (see the module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanningChoice:
    """The algorithm and protocol NCCL's tuner would run, and its time."""

    algorithm: Algorithm
    protocol: Protocol
    time_s: float


def ring_bus_bandwidth_bytes_per_s(members_per_node: int, intra: LinkProfile, inter: LinkProfile) -> float:
    """Bus bandwidth of one ring through ``members_per_node`` members on each node: the node's
    rails at once (one per member, ``inter`` each), at most that of a ring inside one node
    (``intra``), whose members handle every byte alike; one member a node: its rail."""
    rails_bytes_per_s = members_per_node * inter.bandwidth_bytes_per_s
    if members_per_node == 1:
        return rails_bytes_per_s
    return min(rails_bytes_per_s, intra.bandwidth_bytes_per_s)


def _share_bytes_per_s(costs: ProtocolCosts, share: float, busbw: float, nodes: int) -> float:
    """``share`` of ``busbw``, at most LL's cap where the protocol has it."""
    if not costs.capped:
        return share * busbw
    cap = LL_MAX_TWO_NODES_BYTES_PER_S if nodes <= 2 else LL_MAX_MORE_NODES_BYTES_PER_S
    return min(share * busbw, cap)


def _net_hop_s(costs: ProtocolCosts, nccl_hop_s: float, inter: LinkProfile) -> float:
    """A network hop: NCCL's, plus what the profile's link takes beyond NCCL's lightest hop."""
    return nccl_hop_s + costs.plugin_latency_times * max(0.0, inter.latency_s - NET_LIGHTEST_HOP_S)


def ring_time_s(
    op: CollectiveOp,
    message_bytes: float,
    nodes: int,
    members_per_node: int,
    intra: LinkProfile,
    inter: LinkProfile,
    costs: ProtocolCosts,
) -> float:
    """One ring through ``nodes`` x ``members_per_node`` members in the protocol of ``costs``:
    base latency, a hop per step (those crossing nodes at the network's, the rest at NVLink's),
    and the ring's volume over the protocol's share of its bus bandwidth
    (``ring_bus_bandwidth_bytes_per_s``). ``message_bytes`` is the full buffer."""
    n = nodes * members_per_node
    passes = 2 if op is CollectiveOp.ALL_REDUCE else 1
    steps, inter_steps = passes * (n - 1), passes * (nodes - 1)
    net_hop_s = costs.ring_net_hop_s if members_per_node > 1 else costs.tree_net_hop_s
    intra_hop_s = max(costs.ring_nvlink_hop_s, costs.net_overhead_s)
    latency_s = (
        costs.ring_base_s + (steps - inter_steps) * intra_hop_s + inter_steps * _net_hop_s(costs, net_hop_s, inter)
    )
    if op is CollectiveOp.ALL_REDUCE and costs.protocol is Protocol.SIMPLE:
        latency_s *= RING_SIMPLE_PLATEAU
    rails_bytes_per_s = ring_bus_bandwidth_bytes_per_s(members_per_node, intra, inter)
    busbw = _share_bytes_per_s(costs, costs.ring_share, rails_bytes_per_s, nodes)
    return latency_s + op.volume_factor(n) * message_bytes / busbw


def tree_all_reduce_time_s(
    message_bytes: float,
    nodes: int,
    members_per_node: int,
    intra: LinkProfile,
    inter: LinkProfile,
    costs: ProtocolCosts,
) -> float:
    """NCCL's tree all-reduce in the protocol of ``costs``: a chain inside each node and a binary
    tree across ``nodes``, up then down; the buffer moves twice at the protocol's share of
    ``TREE_BANDWIDTH_FRACTION`` of the ring's bus bandwidth, corrected by size as NCCL does."""
    depth = nodes.bit_length() - 1  # NCCL's log2i: floor(log2 nodes)
    hops_s = (members_per_node - 1) * costs.tree_nvlink_hop_s + depth * _net_hop_s(costs, costs.tree_net_hop_s, inter)
    latency_s = costs.tree_base_s + 2 * hops_s
    rails_bytes_per_s = ring_bus_bandwidth_bytes_per_s(members_per_node, intra, inter)
    busbw = _share_bytes_per_s(costs, costs.tree_share, rails_bytes_per_s, nodes)
    size_index = (int(message_bytes) >> 6).bit_length() - 1
    if 0 <= size_index < len(costs.tree_correction):
        busbw *= costs.tree_correction[size_index]
    return latency_s + 2 * message_bytes / busbw


def spanning_choice(
    op: CollectiveOp, message_bytes: float, nodes: int, members_per_node: int, intra: LinkProfile, inter: LinkProfile
) -> SpanningChoice:
    """The (algorithm, protocol) NCCL's tuner runs for ``op`` over ``nodes`` x
    ``members_per_node`` members, and its time: the least of every ring, and for all-reduce
    every tree."""
    best: SpanningChoice | None = None
    for costs in NCCL_PROTOCOLS:
        t = ring_time_s(op, message_bytes, nodes, members_per_node, intra, inter, costs)
        if best is None or t < best.time_s:
            best = SpanningChoice(algorithm=Algorithm.RING, protocol=costs.protocol, time_s=t)
        if op is CollectiveOp.ALL_REDUCE:
            t = tree_all_reduce_time_s(message_bytes, nodes, members_per_node, intra, inter, costs)
            if t < best.time_s:
                best = SpanningChoice(algorithm=Algorithm.TREE, protocol=costs.protocol, time_s=t)
    assert best is not None  # NCCL_PROTOCOLS is not empty
    return best


@functools.lru_cache(maxsize=4096)
def spanning_time_s(
    op: CollectiveOp, message_bytes: float, nodes: int, members_per_node: int, intra: LinkProfile, inter: LinkProfile
) -> float:
    """Seconds for all-reduce, all-gather or reduce-scatter over ``nodes`` x ``members_per_node``
    members, as NCCL's tuner picks (``spanning_choice``). Memoized: a search prices the same few
    (op, size, spread) tens of thousands of times, and pricing six candidates takes 13 us."""
    return spanning_choice(op, message_bytes, nodes, members_per_node, intra, inter).time_s
