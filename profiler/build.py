"""Rank 0 turns the gathered measurements into a ClusterProfile.

Links are stored hierarchically: each node keeps the device matrix measured on it (the first
node's is the default, the nodes whose links or network interface differ are node overrides);
the node matrix holds, for each node pair, the slowest device pair crossing it (per device, one
rail). Slowest, not median: a synchronous job runs at its slowest link, and a median would hide
the one slow pair a profile exists to find.

GEMMs become measured records (used for their exact shapes) and a MatmulModel whose peak is the
best GEMM rate measured (a CPU publishes no peak; a GPU known by name keeps its published peak and
the fraction is measured in each precision timed: ``gemm_efficiency``). Collective times are the
slowest rank's median; other ops' times the median over ranks. Hosts with devices of another type
than the first host's keep their own device profile (a node override), built from their own ranks'
measurements.
"""

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import torch

from planner.schemas import (
    ClusterProfile,
    CollectiveRecord,
    DeviceKind,
    DeviceProfile,
    DType,
    HostProfile,
    LinkMatrix,
    MatmulModel,
    MatmulRecord,
    NicKind,
    NodeOverride,
    OpRecord,
    Placement,
    Provenance,
)
from planner.schemas.settings import ProfileSettings
from profiler.collectives import CollectiveSample, GroupShape, group_shapes
from profiler.links import LinkSample, duplex_bandwidth, link_figures
from profiler.ops import OpsSample
from profiler.topology import RankInfo

PUBLISHED_PEAK_FLOP_PER_S: tuple[tuple[str, dict[DType, float]], ...] = (
    # Dense peaks (no sparsity) of the data-center GPUs a measured CUDA profile recognises by the
    # name torch reports, first match wins (so "GB200" before "B200"); fp32 is the CUDA cores'
    # rate, not TF32's, as plans run fp32 GEMMs in true fp32. Keeping them, not the best rate
    # measured, keeps MFU comparable with published runs. Source: stas00/ml-engineering,
    # compute/accelerator/README.md, "TFLOPS comparison table" (as the dgx presets cite it): A100
    # SXM 312/19.5, H100 SXM 989/67, H200 SXM "the same" compute as the H100 (its memory differs:
    # 141 GB, measured by the profiler), B200 SXM 2250/80 (note: the DGX B200 datasheet), GB200
    # 2500/80 per GPU; FP8 (Hopper, Blackwell) twice the bf16 rate, MXFP8 (Blackwell) at FP8's.
    ("A100", {DType.BF16: 312e12, DType.FP16: 312e12, DType.FP32: 19.5e12}),
    ("H100", {DType.BF16: 989e12, DType.FP16: 989e12, DType.FP32: 67e12, DType.FP8: 1979e12}),
    ("H200", {DType.BF16: 989e12, DType.FP16: 989e12, DType.FP32: 67e12, DType.FP8: 1979e12}),
    ("GB200", {DType.BF16: 2500e12, DType.FP16: 2500e12, DType.FP32: 80e12, DType.FP8: 5e15, DType.MXFP8: 5e15}),
    ("B200", {DType.BF16: 2250e12, DType.FP16: 2250e12, DType.FP32: 80e12, DType.FP8: 4.5e15, DType.MXFP8: 4.5e15}),
)

CUDA_GEMM_TILE = (256, 128)
"""Output tile (rows, columns) of a CUDA GEMM kernel in the wave model: the largest typical cuBLAS
tile (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, Sec. 2.3), as the dgx
presets assume. Every CUDA device gets it over its measured streaming multiprocessors, whatever its
name; CPUs and ROCm GPUs (whose kernels' tiles no source here gives) get no wave model: one unit,
1 x 1 tiles."""

FRACTION_FALLBACK_ORDER = (DType.BF16, DType.FP16, DType.FP32)
"""Whose measured efficiency prices a precision the profile did not time GEMMs in: the first of
these it timed (training precisions first: their tensor-core rate is what plans mostly run)."""


def _matrix(
    values: dict[tuple[int, int], list[float]], size: int, reduce: Callable[[list[float]], float]
) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(reduce(values[(i, j)]) if (i, j) in values else 0.0 for j in range(size)) for i in range(size))


def _duplex_matrix(values: dict[tuple[int, int], list[float]], size: int) -> tuple[tuple[float, ...], ...] | None:
    """Each pair's duplex bandwidth, the slowest figure either end (or any rank pair between two
    nodes) timed, in both [a][b] and [b][a]; None when nothing was measured (samples taken
    without the exchange)."""
    if not values:
        return None
    both: dict[tuple[int, int], list[float]] = defaultdict(list)
    for (a, b), figures in values.items():
        both[(a, b)] += figures
        both[(b, a)] += figures
    return _matrix(both, size, min)


_TIMINGS = frozenset({"fwd_time_s", "fwd_bwd_time_s", "time_s", "spread"})
"""The fields of an op record that each rank measures; the others say which op it timed."""


def _median_records(samples: Iterable[OpRecord]) -> tuple[OpRecord, ...]:
    """One record per op timed (in the order first seen) with the median of every rank's timings."""
    by_op: dict[str, list[OpRecord]] = defaultdict(list)
    for record in samples:
        by_op[record.model_dump_json(exclude=set(_TIMINGS))].append(record)
    return tuple(_median_record(same) for same in by_op.values())


def _median_record(same: list[OpRecord]) -> OpRecord:
    """``same[0]`` with each timing the median over ``same`` (records of one op from every rank)."""
    timed = _TIMINGS & type(same[0]).model_fields.keys()
    return same[0].model_copy(update={name: statistics.median(getattr(r, name) for r in same) for name in timed})


def _node_overrides(
    links: list[LinkMatrix], nics: list[NicKind | None], devices: list[DeviceProfile]
) -> tuple[NodeOverride, ...]:
    """The nodes whose measured links, interface type or device type differ from the first
    node's, grouped where they are the same."""
    differing: dict[tuple[LinkMatrix | None, NicKind | None, str | None], list[int]] = defaultdict(list)
    by_name = {device.name: device for device in devices}
    for node in range(1, len(links)):
        own_links = links[node] if links[node] != links[0] else None
        own_nic = nics[node] if nics[node] != nics[0] else None
        own_device = devices[node].name if devices[node] != devices[0] else None
        if own_links is not None or own_nic is not None or own_device is not None:
            differing[(own_links, own_nic, own_device)].append(node)
    return tuple(
        NodeOverride(
            nodes=tuple(nodes),
            intra_node_links=own_links,
            nic=own_nic,
            device=by_name[own_device] if own_device is not None else None,
        )
        for (own_links, own_nic, own_device), nodes in differing.items()
    )


def published_peaks(device_name: str) -> dict[DType, float] | None:
    """The published dense peaks of a GPU known by ``device_name`` (``PUBLISHED_PEAK_FLOP_PER_S``),
    None for any other device."""
    return next((dict(peaks) for key, peaks in PUBLISHED_PEAK_FLOP_PER_S if key in device_name), None)


def gemm_efficiency(
    best_flop_per_s: dict[DType, float], published: dict[DType, float] | None
) -> tuple[dict[DType, float], float, dict[DType, float]]:
    """(peak FLOP/s by precision, the fraction for unmeasured precisions, the fraction measured in
    each precision) from the best GEMM rate measured in each precision.

    A GPU with published peaks keeps them, and each precision timed gets its own fraction: best
    rate in it / its peak (at least 1e-3, at most 1); a precision not timed is priced at the first
    timed one of ``FRACTION_FALLBACK_ORDER``, but for fp8 and mxfp8, whose share of their peak
    differs from the training precisions' (the presets' measured rates), kept only where timed
    (``planner profile --fp8``): a profile that did not time them prices no FP8 plan. Any other
    device (a CPU, an unknown GPU) takes the best rate measured in each precision as its peak,
    fraction 1, and fp16 at bf16's when only bf16 was timed (a CPU runs it like bf16 at best).
    """
    if published is None:
        peak = dict(best_flop_per_s)
        if DType.FP16 not in peak and DType.BF16 in peak:
            peak[DType.FP16] = peak[DType.BF16]
        return peak, 1.0, {}
    fractions = {
        dtype: min(max(rate / published[dtype], 1e-3), 1.0)
        for dtype, rate in best_flop_per_s.items()
        if dtype in published
    }
    fallback = next((fractions[d] for d in FRACTION_FALLBACK_ORDER if d in fractions), 1e-3)
    peaks = {d: p for d, p in published.items() if d.trains or d in best_flop_per_s}
    return peaks, fallback, fractions


def _device(infos: list[RankInfo], ops: list[OpsSample]) -> DeviceProfile:
    """The profile of one device type from the measurements of the ranks that run on it (``ops``
    is every rank's, by rank): GEMM records and other ops' times are medians over those ranks."""
    mine = [ops[i.rank] for i in infos]
    gemm_times: dict[tuple[int, int, int, DType], list[float]] = defaultdict(list)
    gemm_spreads: dict[tuple[int, int, int, DType], list[float]] = defaultdict(list)
    for rank_ops in mine:
        for g in rank_ops.gemms:
            gemm_times[(g.m, g.n, g.k, g.dtype)].append(g.median_s)
            gemm_spreads[(g.m, g.n, g.k, g.dtype)].append(g.spread)
    matmul_records = tuple(
        MatmulRecord(m=m, n=n, k=k, dtype=dt, time_s=statistics.median(t), spread=statistics.median(gemm_spreads[key]))
        for key, t in sorted(gemm_times.items())
        for (m, n, k, dt) in (key,)
    )
    best = {
        dt: max(2.0 * r.m * r.n * r.k / r.time_s for r in matmul_records if r.dtype is dt)
        for dt in {r.dtype for r in matmul_records}
    }
    device_name, kind = infos[0].device_name, infos[0].device_kind
    peak, fraction, fractions = gemm_efficiency(best, published_peaks(device_name))
    tile_m, tile_n = CUDA_GEMM_TILE if kind is DeviceKind.CUDA else (1, 1)
    workspaces = [o.workspace_bytes for o in mine if o.workspace_bytes is not None]
    copies = [o.host_copies for o in mine if o.host_copies is not None]
    return DeviceProfile(
        name=device_name,
        kind=kind,
        memory_bytes=min(i.memory_bytes for i in infos),
        peak_flop_per_s=peak,
        memory_bandwidth_bytes_per_s=statistics.median(o.stream_bytes_per_s for o in mine),
        matmul=MatmulModel(
            peak_fraction=fraction,
            peak_fraction_by_dtype=fractions,
            compute_units=infos[0].compute_units if kind is DeviceKind.CUDA else 1,
            tile_m=tile_m,
            tile_n=tile_n,
            launch_overhead_s=statistics.median(o.launch_overhead_s for o in mine),
        ),
        matmul_records=matmul_records,
        op_records=_median_records(o for rank_ops in mine for o in rank_ops.others),
        core_share=min(i.core_share for i in infos),
        workspace_bytes=max(workspaces) if workspaces else None,
        host_to_device_bytes_per_s=min(c.host_to_device_bytes_per_s for c in copies) if copies else None,
        device_to_host_bytes_per_s=min(c.device_to_host_bytes_per_s for c in copies) if copies else None,
    )


def _ring_bandwidth(
    shape: GroupShape,
    node_of: dict[int, int],
    local_of: dict[int, int],
    node_links: list[LinkMatrix],
    inter_node_links: LinkMatrix,
) -> float:
    """The slowest link along the rings of ``shape``'s groups at its placement: between consecutive
    members inside a node, or between consecutive nodes (``CollectiveRecord.ring_bandwidth_bytes_per_s``)."""
    slowest = []
    for group in shape.groups:
        if shape.placement is Placement.INTER_NODE:
            nodes = tuple(dict.fromkeys(node_of[r] for r in group))
            slowest.append(inter_node_links.ring_slowest(nodes).bandwidth_bytes_per_s)
        else:
            local = tuple(local_of[r] for r in group)
            slowest.append(node_links[node_of[group[0]]].ring_slowest(local).bandwidth_bytes_per_s)
    return min(slowest)


Figures = dict[tuple[int, int], list[float]]
"""By (source, destination): every figure measured between them."""


def build_profile(
    settings: ProfileSettings,
    infos: list[RankInfo],
    links: list[list[LinkSample]],
    collectives: list[list[CollectiveSample]],
    ops: list[OpsSample],
    *,
    backend: str,
    phase_seconds: dict[str, float] | None = None,
    not_measured: tuple[str, ...] = (),
) -> ClusterProfile:
    """The profile of this cluster from every rank's measurements; ``not_measured`` says what the
    run left out and why (``Provenance.not_measured``)."""
    hosts = sorted({i.host for i in infos}, key=lambda h: min(i.rank for i in infos if i.host == h))
    node_of = {i.rank: hosts.index(i.host) for i in infos}
    local_of = {i.rank: i.local_rank for i in infos}
    per_node = infos[0].local_world_size
    intra, inter = _sorted_figures(settings, links, node_of, local_of, len(hosts))

    # One device type per host; ranks of each type (their host's first rank's name) make its profile.
    device_of_node = [next(i.device_name for i in infos if i.host == h) for h in hosts]
    devices = {
        name: _device([i for i in infos if device_of_node[node_of[i.rank]] == name], ops)
        for name in dict.fromkeys(device_of_node)
    }
    node_links, inter_node_links = _link_matrices(intra, inter, per_node, len(hosts))
    records = _collective_records(infos, collectives, node_of, local_of, node_links, inter_node_links)

    # One network interface type per host (a single host has no inter-node traffic: not known).
    nics = [next(i.nic for i in infos if i.host == h) if len(hosts) > 1 else None for h in hosts]
    return ClusterProfile(
        name=f"measured-{hosts[0]}" + (f"-x{len(hosts)}" if len(hosts) > 1 else ""),
        num_nodes=len(hosts),
        devices_per_node=per_node,
        device=devices[device_of_node[0]],
        intra_node_links=node_links[0],
        nic=nics[0],
        node_overrides=_node_overrides(node_links, nics, [devices[name] for name in device_of_node]),
        inter_node_links=inter_node_links,
        collectives=records,
        host=host_of(ops, node_of, len(hosts)),
        provenance=Provenance(
            kind="measured",
            created=datetime.now(UTC),
            torch_version=torch.__version__,
            backend=backend,
            hosts=tuple(hosts),
            settings=settings.to_record() | {f"seconds_{k}": round(v, 3) for k, v in (phase_seconds or {}).items()},
            not_measured=not_measured,
        ),
    )


def host_of(ops: list[OpsSample], node_of: dict[int, int], num_nodes: int) -> HostProfile | None:
    """Every node's host as the slowest and smallest one measured: its ranks' CPU Adam rates,
    stepping at once, summed (``profiler.host_adam``), and its memory; None where a rank did not
    measure it (CPU ranks)."""
    samples = [o.host_adam for o in ops]
    if not samples or any(s is None for s in samples):
        return None
    rates, memory = [0.0] * num_nodes, [0] * num_nodes
    for rank, sample in enumerate(samples):
        assert sample is not None
        rates[node_of[rank]] += sample.params_per_s
        memory[node_of[rank]] = sample.host_memory_bytes
    return HostProfile(memory_bytes=min(memory), adam_params_per_s=min(rates))


def _sorted_figures(
    settings: ProfileSettings,
    links: list[list[LinkSample]],
    node_of: dict[int, int],
    local_of: dict[int, int],
    num_nodes: int,
) -> tuple[dict[int, dict[str, Figures]], dict[str, Figures]]:
    """Every link sample's bandwidth, latency, spread and duplex bandwidth, sorted by where it ran:
    by node, between its local devices; or between two nodes (no spread kept)."""
    intra: dict[int, dict[str, Figures]] = {
        node: {
            "bw": defaultdict(list),
            "lat": defaultdict(list),
            "spread": defaultdict(list),
            "duplex": defaultdict(list),
        }
        for node in range(num_nodes)
    }
    inter: dict[str, Figures] = {
        "bw": defaultdict(list),
        "lat": defaultdict(list),
        "duplex": defaultdict(list),
    }
    for link in (s for rank_samples in links for s in rank_samples):
        bw, lat, bw_spread = link_figures(link, settings.latency_bytes, settings.bandwidth_bytes)
        duplex = duplex_bandwidth(link, settings.bandwidth_bytes)
        if node_of[link.src] == node_of[link.dst]:
            pair, on_node = (local_of[link.src], local_of[link.dst]), intra[node_of[link.src]]
            on_node["bw"][pair].append(bw)
            on_node["lat"][pair].append(lat)
            on_node["spread"][pair].append(bw_spread)
            if duplex is not None:
                on_node["duplex"][pair].append(duplex)
        else:
            pair = (node_of[link.src], node_of[link.dst])
            inter["bw"][pair].append(bw)
            inter["lat"][pair].append(lat)
            if duplex is not None:
                inter["duplex"][pair].append(duplex)
    return intra, inter


def _link_matrices(
    intra: dict[int, dict[str, Figures]], inter: dict[str, Figures], per_node: int, num_nodes: int
) -> tuple[list[LinkMatrix], LinkMatrix]:
    """Each node's device matrix and the node matrix: the slowest bandwidth and latency of each
    pair (the widest spread), as a synchronous job runs at its slowest link."""
    node_links = [
        LinkMatrix(
            size=per_node,
            bandwidth_bytes_per_s=_matrix(intra[node]["bw"], per_node, min),
            latency_s=_matrix(intra[node]["lat"], per_node, max),
            bandwidth_spread=_matrix(intra[node]["spread"], per_node, max),
            duplex_bandwidth_bytes_per_s=_duplex_matrix(intra[node]["duplex"], per_node),
        )
        for node in range(num_nodes)
    ]
    inter_node_links = LinkMatrix(
        size=num_nodes,
        bandwidth_bytes_per_s=_matrix(inter["bw"], num_nodes, min),
        latency_s=_matrix(inter["lat"], num_nodes, max),
        duplex_bandwidth_bytes_per_s=_duplex_matrix(inter["duplex"], num_nodes),
    )
    return node_links, inter_node_links


def _collective_records(
    infos: list[RankInfo],
    collectives: list[list[CollectiveSample]],
    node_of: dict[int, int],
    local_of: dict[int, int],
    node_links: list[LinkMatrix],
    inter_node_links: LinkMatrix,
) -> tuple[CollectiveRecord, ...]:
    """One record per (group shape, op, message size): the slowest rank's median time, with the
    slowest link along the shape's rings."""
    # A one-member group (the "world" of a one-rank job) communicates nothing: no record.
    shapes = {s.name: s for s in group_shapes(infos) if len(s.groups[0]) >= 2}
    ring_bandwidth = {
        name: _ring_bandwidth(shape, node_of, local_of, node_links, inter_node_links) for name, shape in shapes.items()
    }
    slowest: dict[tuple[str, str, int], CollectiveSample] = {}
    for sample in (s for rank_samples in collectives for s in rank_samples if s.shape in shapes):
        key = (sample.shape, str(sample.op), sample.message_bytes)
        if key not in slowest or sample.median_s > slowest[key].median_s:
            slowest[key] = sample
    return tuple(
        CollectiveRecord(
            op=s.op,
            placement=shapes[s.shape].placement,
            group_size=len(shapes[s.shape].groups[0]),
            members_per_node=shapes[s.shape].members_per_node,
            message_bytes=s.message_bytes,
            time_s=s.median_s,
            spread=s.spread,
            ring_bandwidth_bytes_per_s=ring_bandwidth[s.shape],
        )
        for s in slowest.values()
    )
