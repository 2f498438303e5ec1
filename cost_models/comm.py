"""Time of collectives and point-to-point transfers over the links a group actually uses.

Conventions (nccl-tests, "PERFORMANCE.md"): ``message_bytes`` is the full buffer; a ring
all-reduce moves 2(n-1)/n of it per rank, all-gather, reduce-scatter and all-to-all (n-1)/n;
bus bandwidth = that volume / time, which is nearly independent of n. Pricing, in order:
1. the profile's collective records for the op and placement: bus bandwidth interpolated
   log-log in message size (records of all-reduce stand in for the other ops, whose bus
   bandwidth nccl-tests reports alike at large sizes). A record that says over which links its
   groups ran (``CollectiveRecord.ring_bandwidth_bytes_per_s``, the slowest of them) is scaled
   to the priced group's own slowest link: a pair measured over a slowed link does not price
   every pair as slow, nor a fast one a group that crosses the slow link. The whole curve
   scales (a ring's bus bandwidth is its slowest link's), its small-message part too;
2. otherwise a ring over the group's slowest link: (n-1) steps of latency plus volume / bandwidth.
A group spanning nodes, k members on each, that the profile measured whole (its records of this
op, else all-reduce, at ``Placement.INTER_NODE`` with n members, k per node: the profiler's
whole-world shape) is priced from those records (scaled as in 1.) when its ring visits each node's members in one
run, as the measured group's did: a measured curve of the group itself beats a model of it (on
gloo, whose rings are flat, the hierarchical model below priced a 2 x 2 ZeRO-3 all-gather well
below the measured time: ``benchmarks/hsdp_netns.py``). All-to-all keeps its link pricing (a
dispatcher may send less off-node than the measured all-to-all). Any other all-reduce,
all-gather or reduce-scatter over a group with k members on each of its N nodes, on a profile that
measured none of them across nodes (the presets), is priced as NCCL runs it
(``cost_models.spanning_collectives``): one ring through all n = N k members, a hop of latency a
step, at the bus bandwidth of the node's k rails at once (bounded by the links inside the
slowest node), or for all-reduce a tree across the nodes, in NCCL's LL, LL128 or Simple protocol
at its tuner's latencies, whichever is fastest. The rest (a profile
with inter-node records of other shapes, members spread unevenly) is priced hierarchically: a
phase inside each node over its k members, and a phase across the N nodes in which each of the
k members moves 1/k of the data over its own network rail, from the inter-node records. Each
node's inside phase runs over that node's own links and records (nodes may differ:
``ClusterProfile.node_overrides``); the slowest node decides, as the step waits for every rank.
Units: bytes, seconds, bytes/s.
"""

import bisect
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from cost_models.memo import HeldMemo
from cost_models.spanning_collectives import spanning_time_s
from planner.schemas import ClusterProfile, CollectiveOp, CollectiveRecord, LinkProfile, Placement
from planner.schemas.links import slower_link


@dataclass(frozen=True, slots=True)
class Group:
    """The devices of one process group (numbered node by node, as ``schemas.DeviceMap`` numbers
    them), ordered as the ring runs: a range where they are evenly spaced (hashed in constant
    time: a search prices groups of a thousand devices tens of thousands of times). Its hash is
    computed once: the memos key on tuples of an axis's groups, hundreds of them."""

    devices: tuple[int, ...] | range
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.devices))

    def __hash__(self) -> int:
        return self._hash

    @property
    def size(self) -> int:
        """Members."""
        return len(self.devices)


@dataclass(frozen=True, slots=True)
class AxisGroups:
    """The groups of one axis of a layout's mesh (of one stage, of one size: ``cost_models.groups``):
    runs of ``size`` ranks ``stride`` apart from each of ``starts``, on the devices ``devices``
    maps them to (empty: rank r on device r). Listed anew at each iteration, and equal to another
    layout's where ``key`` is: what the groups depend on (the axis, the mesh's shape and its device
    map). ``priced_groups`` memoizes on it, so the layouts of a search that differ only in what
    groups do not read (micro-batch, recompute, schedule, ZeRO stage) sort a mesh's groups once: on
    a cluster of mixed nodes every group of an axis is read, thousands of them a layout."""

    key: tuple[object, ...]
    starts: Callable[[], Sequence[int]] = field(compare=False, repr=False)
    size: int = field(compare=False)
    stride: int = field(compare=False)
    devices: tuple[int, ...] = field(compare=False, repr=False)

    def __iter__(self) -> Iterator[Group]:
        return map(self.group, self.starts())

    def group(self, first: int) -> Group:
        """The group from rank ``first``."""
        ranks = range(first, first + self.size * self.stride, self.stride)
        return Group(tuple(self.devices[r] for r in ranks) if self.devices else ranks)

    def device_array(self, starts: Sequence[int] | None = None) -> np.ndarray:
        """The devices of every group, a row each in ring order (``starts``: the ``starts()`` the
        caller already has)."""
        starts = self.starts() if starts is None else starts
        ranks = np.asarray(starts, dtype=np.int64)[:, None] + self.stride * np.arange(self.size)
        return np.asarray(self.devices, dtype=np.int64)[ranks] if self.devices else ranks


class PricedGroups(tuple[Group, ...]):
    """The groups of an axis that ``priced_groups`` chose, as a tuple whose hash is computed once
    and one object for equal groups (``of``): the memos key on them, and hashing a tuple asks each
    of its hundreds of groups again, as comparing two equal tuples that are not one object does."""

    _hash: int

    def __new__(cls, groups: Iterable[Group]) -> "PricedGroups":
        self = super().__new__(cls, groups)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, groups: Iterable[Group]) -> "PricedGroups":
        """The one object of these groups (made once: the axes of many layouts list the same)."""
        made = cls(groups)
        if len(_CANONICAL) >= _CANONICAL_LIMIT:
            _CANONICAL.clear()
        return _CANONICAL.setdefault(made, made)


_CANONICAL: dict[PricedGroups, PricedGroups] = {}
_CANONICAL_LIMIT = 65536


def _curve_time_s(records: Sequence[CollectiveRecord], op: CollectiveOp, message_bytes: float, n: int) -> float:
    """Interpolate bus bandwidth log-log over ``records`` (one group size), clamped at the ends."""
    pts = sorted((r.message_bytes, r.op.volume_factor(r.group_size) * r.message_bytes / r.time_s) for r in records)
    sizes = [math.log(p[0]) for p in pts]
    x = math.log(max(message_bytes, 1.0))
    i = bisect.bisect_left(sizes, x)
    if i == 0:
        busbw = pts[0][1]
    elif i == len(pts):
        busbw = pts[-1][1]
    else:
        (x0, y0), (x1, y1) = (sizes[i - 1], math.log(pts[i - 1][1])), (sizes[i], math.log(pts[i][1]))
        busbw = math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return op.volume_factor(n) * message_bytes / busbw


def _measured_time_s(
    records: Sequence[CollectiveRecord], op: CollectiveOp, message_bytes: float, n: int, link: LinkProfile
) -> float:
    """``_curve_time_s`` over records of one group shape, scaled from the slowest link their groups
    ran over to ``link``, the priced group's, where the records say which that was."""
    measured_over = records[0].ring_bandwidth_bytes_per_s
    scale = 1.0 if measured_over is None else measured_over / link.bandwidth_bytes_per_s
    return scale * _curve_time_s(records, op, message_bytes, n)


@dataclass(frozen=True, slots=True, eq=False)
class _Records:
    """A cluster's collective records as a memo key compared by identity: hashing the records
    themselves costs more than most of the pricing it saves. Sound because the tuple is immutable
    and the key holds it, so its identity cannot pass to other records while it is cached."""

    records: tuple[CollectiveRecord, ...]

    def __hash__(self) -> int:
        return id(self.records)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Records) and other.records is self.records


def _matching_records(
    collectives: tuple[CollectiveRecord, ...], op: CollectiveOp, placement: Placement, n: int, per_node: int
) -> list[CollectiveRecord]:
    """Records of ``op`` (else all-reduce) at ``placement`` for the nearest group shape."""
    for candidate_op in (op, CollectiveOp.ALL_REDUCE):
        recs = [r for r in collectives if r.op is candidate_op and r.placement is placement]
        if recs:
            best = min(
                {(r.group_size, r.members_per_node) for r in recs},
                key=lambda g: (abs(g[0] - n), abs(g[1] - per_node)),
            )
            return [r for r in recs if (r.group_size, r.members_per_node) == best]
    return []


@functools.lru_cache(maxsize=4096)
def _flat_time_s(
    collectives: _Records,
    op: CollectiveOp,
    message_bytes: float,
    n: int,
    placement: Placement,
    link: LinkProfile,
) -> float:
    """One phase of a collective over ``n`` members at ``placement`` whose ring's slowest link is
    ``link``: from the profile's records (``collectives``), scaled to ``link`` where they say which
    links they ran over, else a ring over ``link``. Memoized: a search prices the same gradients
    over the same groups for the many layouts that differ only in micro-batch, recompute or
    sequence parallelism."""
    per_node = n if placement is Placement.INTRA_NODE else 1
    records = _matching_records(collectives.records, op, placement, n, per_node)
    if records:
        return _measured_time_s(records, op, message_bytes, n, link)
    steps = 2 * (n - 1) if op is CollectiveOp.ALL_REDUCE else n - 1
    return steps * link.latency_s + op.volume_factor(n) * message_bytes / link.bandwidth_bytes_per_s


def _node_spread(
    devices: tuple[int, ...] | range, per_node: int
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], int]:
    """The nodes a group spans (in ring order), its members' local indices on each of them (in
    ring order), and the most members on any one node."""
    by_node: dict[int, list[int]] = {}
    for r in devices:
        by_node.setdefault(r // per_node, []).append(r % per_node)
    nodes = tuple(by_node)
    return nodes, tuple(tuple(by_node[n]) for n in nodes), max(len(v) for v in by_node.values())


def _runs_node_by_node(devices: tuple[int, ...] | range, per_node: int) -> bool:
    """Whether a ring over ``devices`` (in order, closing back to the first) visits each node's
    members in one run: it then crosses between nodes once per node, as a ring over ranks in
    order does."""
    node_of = [r // per_node for r in devices]
    changes = sum(a != b for a, b in zip(node_of, node_of[1:] + node_of[:1], strict=True))
    return changes == len(set(node_of))


@dataclass(frozen=True, slots=True)
class _Spread:
    """How a group lies over a cluster's nodes, and the slowest links its rings run over there:
    all that ``collective_time_s`` reads of the group, whatever the op and message."""

    nodes: tuple[int, ...]
    """The nodes it spans, in ring order."""
    k: int
    """The most members on any one node."""
    even: bool
    """Whether every node holds ``k`` members."""
    node_by_node: bool
    """Whether its ring visits each node's members in one run (``_runs_node_by_node``)."""
    inter_link: LinkProfile | None
    """The slowest link of the ring through ``nodes`` (None inside one node)."""
    inside: tuple[tuple[int, LinkProfile], ...]
    """(node, the slowest link of the ring through its members) of each node holding two or more."""

    @property
    def slowest_inside(self) -> LinkProfile:
        """The slowest bandwidth and latency of the rings inside its nodes (at least one)."""
        return functools.reduce(slower_link, (link for _, link in self.inside))


def _spread(group: Group, cluster: ClusterProfile) -> _Spread:
    """Read once per group and cluster (``_SPREADS``): a search prices each group of an axis for
    every op, message and layout that shares it, and on a cluster whose node matrix is explicit
    every group of every axis is priced."""
    per_node = cluster.devices_per_node
    nodes, members, k = _node_spread(group.devices, per_node)
    return _Spread(
        nodes=nodes,
        k=k,
        even=all(len(m) == k for m in members),
        node_by_node=len(nodes) > 1 and _runs_node_by_node(group.devices, per_node),
        inter_link=cluster.inter_node_links.ring_slowest(nodes) if len(nodes) > 1 else None,
        inside=tuple(
            (node, cluster.node_links(node).ring_slowest(local))
            for node, local in zip(nodes, members, strict=True)
            if len(local) > 1
        ),
    )


_SPREADS: HeldMemo[_Spread] = HeldMemo(limit=65536)


def _spread_of(group: Group, cluster: ClusterProfile) -> _Spread:
    """``_spread``, memoized per cluster object and group (a Group hashes in constant time)."""
    return _SPREADS.get(cluster, (group,), lambda: _spread(group, cluster))


@functools.lru_cache(maxsize=1024)
def _whole_group_records(
    collectives: _Records, op: CollectiveOp, n: int, per_node: int
) -> tuple[CollectiveRecord, ...]:
    """The records of ``op`` (else all-reduce) measured over a group of exactly ``n`` members,
    ``per_node`` on each of its nodes, across nodes; empty if the profile has none."""
    for candidate_op in (op, CollectiveOp.ALL_REDUCE):
        found = tuple(
            r
            for r in collectives.records
            if r.op is candidate_op
            and r.placement is Placement.INTER_NODE
            and r.group_size == n
            and r.members_per_node == per_node
        )
        if found:
            return found
    return ()


@functools.lru_cache(maxsize=64)
def _has_inter_node_records(collectives: _Records, op: CollectiveOp) -> bool:
    """Whether the profile measured ``op`` (or all-reduce, which stands in for it) across nodes."""
    return any(
        r.placement is Placement.INTER_NODE and r.op in (op, CollectiveOp.ALL_REDUCE) for r in collectives.records
    )


def nodes_spanned(group: Group, cluster: ClusterProfile) -> int:
    """How many nodes the group's devices lie on."""
    return len(_spread_of(group, cluster).nodes)


def device_link(cluster: ClusterProfile, src: int, dst: int) -> LinkProfile:
    """The link from device ``src`` to device ``dst`` (numbered node by node, as ``schemas.DeviceMap``
    numbers them): inside a node, that node's own matrix (``ClusterProfile.node_links``); across
    nodes, the node matrix. Every caller that needs one link reads it here."""
    per_node = cluster.devices_per_node
    src_node, dst_node = src // per_node, dst // per_node
    if src_node == dst_node:
        return cluster.node_links(src_node).link(src % per_node, dst % per_node)
    return cluster.inter_node_links.link(src_node, dst_node)


def _alike_nodes(cluster: ClusterProfile) -> bool:
    """Whether every node has the default intra-node links and collective records. Memoized per
    cluster: comparing link matrices compares every entry."""
    if not cluster.node_overrides:
        return True
    return _ALIKE.get(
        cluster,
        (),
        lambda: all(
            o.intra_node_links in (None, cluster.intra_node_links) and o.collectives is None
            for o in cluster.node_overrides
        ),
    )


_ALIKE: HeldMemo[bool] = HeldMemo(limit=256)


def _inside_phase_s(cluster: ClusterProfile, op: CollectiveOp, message_bytes: float, k: int, spread: _Spread) -> float:
    """The phase of a collective inside the nodes a group spans, ``k`` members on each: every node
    runs its own at once over its own links and records, and the slowest decides. A node holding
    a single member has no inside phase."""
    if cluster.intra_node_links.uniform is not None and _alike_nodes(cluster):
        records, link = _Records(cluster.collectives), cluster.intra_node_links.uniform
        return _flat_time_s(records, op, message_bytes, k, Placement.INTRA_NODE, link)
    return max(
        (
            _flat_time_s(_Records(cluster.node_collectives(node)), op, message_bytes, k, Placement.INTRA_NODE, link)
            for node, link in spread.inside
        ),
        default=0.0,
    )


def collective_time_s(
    op: CollectiveOp, message_bytes: float, group: Group, cluster: ClusterProfile, *, off_node_share: float = 1.0
) -> float:
    """Seconds for ``op`` over ``group`` on ``cluster`` (see module docstring).

    A group inside one node runs over that node's links (``ClusterProfile.node_links``) and
    collective records; a group spanning nodes runs each node's inside phase over its own, and
    waits for the slowest.

    ``off_node_share`` scales what an all-to-all spanning nodes sends off-node: 1 sends every
    byte bound for a remote node; a dispatcher that sends a token once per remote node and
    forwards it there sends less (``expert_parallel.off_node_share``).
    """
    n = group.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    spread = _spread_of(group, cluster)
    nodes, k = spread.nodes, spread.k
    if spread.inter_link is None:
        return _inside_phase_s(cluster, op, message_bytes, n, spread)
    inter_link = spread.inter_link
    if op is not CollectiveOp.ALL_TO_ALL and spread.node_by_node:
        whole = _whole_group_records(_Records(cluster.collectives), op, n, k)
        if whole and spread.even:
            return _measured_time_s(whole, op, message_bytes, n, inter_link)
    if (
        op is not CollectiveOp.ALL_TO_ALL
        and spread.even
        and not _has_inter_node_records(_Records(cluster.collectives), op)
    ):
        intra_link = spread.slowest_inside if k > 1 else inter_link
        return spanning_time_s(op, message_bytes, len(nodes), k, intra_link, inter_link)
    if op is CollectiveOp.ALL_TO_ALL:
        # Each rank sends (n - k)/n of its buffer off-node over its own rail, the rest over
        # intra-node links; both proceed at once.
        intra_link = spread.slowest_inside if k > 1 else inter_link
        off_node_s = off_node_share * (n - k) / n * message_bytes / inter_link.bandwidth_bytes_per_s
        on_node_s = (k - 1) / n * message_bytes / intra_link.bandwidth_bytes_per_s
        return (len(nodes) - 1) * inter_link.latency_s + max(off_node_s, on_node_s)
    inter_s = _flat_time_s(
        _Records(cluster.collectives), op, message_bytes / k, len(nodes), Placement.INTER_NODE, inter_link
    )
    if k == 1:
        return inter_s
    # All-reduce = reduce-scatter + all-gather inside the node around the inter-node phase;
    # all-gather and reduce-scatter need one intra-node phase; all-to-all one as well.
    intra_op = CollectiveOp.REDUCE_SCATTER if op is CollectiveOp.ALL_REDUCE else op
    intra_phases = 2 if op is CollectiveOp.ALL_REDUCE else 1
    return intra_phases * _inside_phase_s(cluster, intra_op, message_bytes, k, spread) + inter_s


def has_uniform_links(cluster: ClusterProfile) -> bool:
    """Whether every link of a class is the same, so one group stands for all of its axis: both
    matrices uniform and every node with the default intra-node links and collective records.
    Nodes that differ only in their devices or interface type keep it (a collective's time reads
    links and curves, not devices, and the node matrix is the truth)."""
    return (
        cluster.intra_node_links.uniform is not None
        and cluster.inter_node_links.uniform is not None
        and _alike_nodes(cluster)
    )


def priced_groups(groups: Iterable[Group], cluster: ClusterProfile, *, rank_order: bool) -> PricedGroups:
    """The groups of one axis whose collectives need pricing (an axis can have a thousand);
    memoized where ``groups`` are an ``AxisGroups``.

    With uniform links of each class, a group's cost depends only on how it spreads over nodes;
    with devices in rank order (``rank_order``: the identity device map) every group of an axis
    spreads alike where the degrees divide the node's devices or are multiples of them, as the
    search's are, so the first stands for all. Otherwise a group's cost depends only on the
    classes of the nodes it spans (``ClusterProfile.node_classes``: nodes described alike) and
    its members' local indices on each (their count, over uniform links inside every node), so
    one group of each such spread stands for the others;
    where the node matrix is explicit, every group is priced.
    """
    first_stands = rank_order and has_uniform_links(cluster)
    classes = None if first_stands else cluster.node_classes
    # Over uniform links inside every node, how many members a node holds matters, not which
    # (read only where classes sort the groups).
    by_count = (
        classes is not None
        and cluster.intra_node_links.uniform is not None
        and all(o.intra_node_links is None or o.intra_node_links.uniform is not None for o in cluster.node_overrides)
    )
    shape = (first_stands, classes, cluster.devices_per_node, by_count)
    if isinstance(groups, AxisGroups):
        return _priced_axis(groups, *shape)
    return _representatives(groups, *shape)


@functools.lru_cache(maxsize=8192)
def _priced_axis(
    groups: AxisGroups, first_stands: bool, classes: tuple[int, ...] | None, per_node: int, by_count: bool
) -> PricedGroups:
    """``_representatives`` of an axis's groups, by the axis's key and what the cluster's node
    classes are (not by cluster: a stage priced on its own device type reads a copy of the
    cluster whose nodes fall into the same classes). Where classes sort the groups, the first of
    each spread is found on arrays (``spread_rows``)."""
    if first_stands or classes is None:
        return _representatives(groups, first_stands, classes, per_node, by_count)
    starts = groups.starts()
    rows = spread_rows(groups.device_array(starts), per_node, np.asarray(classes, dtype=np.int64), by_count)
    return PricedGroups.of(groups.group(starts[i]) for i in first_rows(rows))


def spread_rows(devices: np.ndarray, per_node: int, classes: np.ndarray, by_count: bool) -> np.ndarray:
    """One row per group (a row of ``devices`` each, in ring order), equal where
    ``_representatives`` finds the same spread: its members node by node, the nodes in the order
    the ring first reaches them and each node's members in ring order, as where each node's run
    starts, the class of each member's node and, unless only counts matter, each member's local
    index. On arrays: a search sorts thousands of axes of hundreds of groups each, which one
    Python loop per group took most of a measured-like search to walk."""
    n = devices.shape[1]
    nodes = devices // per_node
    order = np.argsort(nodes, axis=1, kind="stable")  # members by node, ring order kept within each
    by_node = np.take_along_axis(nodes, order, axis=1)
    starts = np.ones(by_node.shape, dtype=bool)
    starts[:, 1:] = by_node[:, 1:] != by_node[:, :-1]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0), axis=1)
    first_seen = np.empty_like(order)  # the ring position at which each member's node is first reached
    np.put_along_axis(first_seen, order, np.take_along_axis(order, run_start, axis=1), axis=1)
    canonical = np.argsort(first_seen * n + np.arange(n), axis=1)
    seen = np.take_along_axis(first_seen, canonical, axis=1)
    parts = [
        (seen[:, 1:] != seen[:, :-1]).astype(np.int64),
        classes[np.take_along_axis(nodes, canonical, axis=1)],
    ]
    if not by_count:
        parts.append(np.take_along_axis(devices % per_node, canonical, axis=1))
    return np.concatenate(parts, axis=1)


def first_rows(rows: np.ndarray) -> list[int]:
    """The index of the first of each distinct row of a 2-D integer array, ascending (rows
    compared as bytes: ``np.unique(axis=0)`` sorts them as records, several times slower)."""
    rows = np.ascontiguousarray(rows)
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first = np.unique(as_bytes, return_index=True)
    return sorted(first.tolist())


def _representatives(
    groups: Iterable[Group], first_stands: bool, classes: tuple[int, ...] | None, per_node: int, by_count: bool
) -> PricedGroups:
    """The first group of each spread over node classes (``priced_groups``): the first group alone
    where it stands for all, every group where the nodes have no classes (an explicit node matrix)."""
    if first_stands:
        return PricedGroups.of(itertools.islice(groups, 1))
    if classes is None:
        return PricedGroups.of(groups)
    spreads: dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...] | tuple[int, ...]], Group] = {}
    for group in groups:
        nodes, members, _ = _node_spread(group.devices, per_node)
        local = tuple(len(m) for m in members) if by_count else members
        spreads.setdefault((tuple(classes[n] for n in nodes), local), group)
    return PricedGroups.of(spreads.values())


def slowest_collective_s(
    op: CollectiveOp, message_bytes: float, groups: Iterable[Group], cluster: ClusterProfile
) -> float:
    """The slowest group's time: groups of one axis run at once and the step waits for all.

    Args:
        op: the collective.
        message_bytes: the full buffer of each group (nccl-tests convention), bytes.
        groups: the axis's groups (devices) that need pricing (``priced_groups``).
        cluster: links and collective records.

    Returns:
        Seconds of the slowest group's collective; 0 without groups.

    Memoized where ``groups`` is a tuple (as ``priced_groups`` returns them): a search prices the
    same message over the same groups for every layout that differs only in what does not change
    it (micro-batch size, recompute, schedule for the gradients), and on a cluster whose node
    matrix is explicit every group of an axis is priced (``priced_groups``).
    """
    if not isinstance(groups, tuple):
        return _slowest_s(op, message_bytes, groups, cluster)
    return _SLOWEST.get(cluster, (op, message_bytes, groups), lambda: _slowest_s(op, message_bytes, groups, cluster))


def _slowest_s(op: CollectiveOp, message_bytes: float, groups: Iterable[Group], cluster: ClusterProfile) -> float:
    return max((collective_time_s(op, message_bytes, group, cluster) for group in groups), default=0.0)


_SLOWEST: HeldMemo[float] = HeldMemo(limit=65536)


def transfer_time_s(message_bytes: float, link: LinkProfile) -> float:
    """One send of ``message_bytes`` over ``link``: latency + bytes / bandwidth, seconds."""
    return link.latency_s + message_bytes / link.bandwidth_bytes_per_s


def p2p_time_s(message_bytes: float, src: int, dst: int, cluster: ClusterProfile) -> float:
    """One send of ``message_bytes`` from device ``src`` to device ``dst`` over their link (``device_link``)."""
    return transfer_time_s(message_bytes, device_link(cluster, src, dst))
