"""Cluster presets: a ClusterProfile built from a machine's published figures, each naming its
source or marked as an assumption.

Presets ship as package data under ``planner/presets/clusters/<name>.yaml``.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from planner.files.reading import describe, did_you_mean, list_presets, preset_named, read_preset, validate
from planner.schemas import (
    AttentionKernel,
    AttentionRecord,
    ClusterProfile,
    CollectiveRecord,
    DeviceKind,
    DeviceProfile,
    DType,
    HostProfile,
    LinkMatrix,
    LinkProfile,
    MatmulModel,
    Provenance,
)
from planner.schemas.bounds import MAX_DEVICES
from planner.schemas.cluster import NicKind
from planner.schemas.errors import SchemaError
from planner.schemas.op_records import attention_forward_flop


def list_cluster_presets() -> tuple[str, ...]:
    """Names of the packaged cluster presets, sorted."""
    return list_presets("clusters")


def cluster_preset(name: str, num_nodes: int) -> ClusterProfile:
    """Build the ClusterProfile of ``num_nodes`` nodes of a preset machine from its published figures.

    Links inside a node are uniform (NVSwitch) or given pair by pair where pairs differ (the two
    dies of an MI250X and the links between packages: ``_intra_node_links``); across nodes each
    device has its own network rail: its NIC's rate, divided among the devices sharing one NIC where
    the preset gives ``devices_per_nic``. The collectives are the preset's published curve,
    and the provenance date is fixed in the preset file, so the same arguments always give the same
    profile.

    Raises:
        SchemaError: unknown preset or ``num_nodes`` not a whole number >= 1.
    """
    presets = list_cluster_presets()
    preset = preset_named(name, presets)
    if preset is None:
        raise SchemaError(
            f"unknown cluster preset {name!r}{did_you_mean(name, presets)}; presets: {', '.join(presets)}"
        )
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise SchemaError(f"num_nodes={num_nodes!r} must be a whole number >= 1")
    if num_nodes > MAX_DEVICES:  # before its node matrix is built; ClusterProfile bounds the devices
        raise SchemaError(
            f"cluster preset {preset!r}: num_nodes={num_nodes} is more than any cluster this planner plans "
            f"(at most {MAX_DEVICES:,} devices)"
        )
    return _build_cluster(read_preset("clusters", preset), name=preset, num_nodes=num_nodes)


@dataclass(frozen=True, slots=True)
class _PresetReader:
    """Reads a cluster preset's figures, each of which must name a source or an assumption."""

    where: str
    source_ids: frozenset[str]

    def section(self, node: Mapping[str, object], key: str) -> Mapping[str, object]:
        value = node.get(key)
        if not isinstance(value, Mapping):
            raise SchemaError(f"{self.where}: {key!r} must be a mapping, got {value!r}")
        return value

    def traced(self, node: Mapping[str, object], label: str) -> None:
        source, assumption = node.get("source"), node.get("assumption")
        if source is not None and source not in self.source_ids:
            raise SchemaError(f"{self.where}: {label} names source {source!r}, which is not in 'sources'")
        if source is None and not (isinstance(assumption, str) and assumption.strip()):
            raise SchemaError(f"{self.where}: {label} names no source and is not marked as an assumption")

    def figure(self, node: Mapping[str, object], key: str) -> float:
        entry = self.section(node, key)
        self.traced(entry, repr(key))
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{self.where}: {key!r} value must be a number, got {value!r}")
        return float(value)

    def count(self, node: Mapping[str, object], key: str) -> int:
        value = self.figure(node, key)
        if not value.is_integer():
            raise SchemaError(f"{self.where}: {key!r} must be a whole number, got {value!r}")
        return int(value)


def _build_cluster(raw: Mapping[str, object], *, name: str, num_nodes: int) -> ClusterProfile:
    where = f"cluster preset {name!r}"
    sources = raw.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, Mapping) for s in sources):
        raise SchemaError(f"{where}: 'sources' must be a list of {{id, ref}} mappings")
    reader = _PresetReader(where, frozenset(str(s.get("id")) for s in sources))
    try:
        fields = _cluster_fields(raw, reader, sources, name=name, num_nodes=num_nodes)
    except ValidationError as e:
        raise SchemaError(describe(e, where, None)) from e
    return validate(ClusterProfile, fields, where)


def _cluster_fields(
    raw: Mapping[str, object],
    reader: _PresetReader,
    sources: list[Mapping[str, object]],
    *,
    name: str,
    num_nodes: int,
) -> dict[str, object]:
    """The ClusterProfile's fields from a preset's figures, converted to base units."""
    where = reader.where
    device, intra, inter = (reader.section(raw, k) for k in ("device", "intra_node_link", "inter_node_link"))
    peaks = reader.section(device, "peak_flop_per_s")
    bandwidth, matmul = reader.section(device, "memory_bandwidth"), reader.section(device, "matmul")
    sustained = reader.figure(matmul, "sustained_fraction")
    # A preset with a per-tile cost beside the k loop states the k of its best measured shape, whose
    # rate is then that cost's share below the long-k rate the model scales from.
    k_overhead = reader.figure(matmul, "k_overhead") if "k_overhead" in matmul else 0.0
    best_shape_k = reader.figure(matmul, "best_measured_shape_k") if k_overhead else 1.0
    devices_per_node = reader.count(raw, "devices_per_node")
    try:
        peak_flop_per_s = {DType(str(dtype)): reader.figure(peaks, str(dtype)) for dtype in peaks}
        bf16_peak = peak_flop_per_s[DType.BF16]
    except (ValueError, KeyError) as e:
        keys = "/".join(DType)
        raise SchemaError(f"{where}: peak_flop_per_s needs bf16 and only {keys} keys ({e})") from e
    try:
        kind = DeviceKind(str(device.get("kind")))
    except ValueError as e:
        kinds = ", ".join(DeviceKind)
        raise SchemaError(f"{where}: device.kind={device.get('kind')!r} must be one of {kinds}") from e
    return {
        "name": name,
        "num_nodes": num_nodes,
        "devices_per_node": devices_per_node,
        "device": DeviceProfile(
            name=str(device.get("name")),
            kind=kind,
            memory_bytes=reader.count(device, "memory_bytes"),
            peak_flop_per_s=peak_flop_per_s,
            memory_bandwidth_bytes_per_s=reader.figure(bandwidth, "nominal_bytes_per_s")
            * reader.figure(bandwidth, "achievable_fraction"),
            matmul=MatmulModel(
                # Training runs every GPU at its power limit: the sustained rate, not the burst.
                peak_fraction=reader.figure(matmul, "best_measured_bf16_flop_per_s")
                * (1.0 + k_overhead / best_shape_k)
                * sustained
                / bf16_peak,
                compute_units=reader.count(matmul, "compute_units"),
                tile_m=reader.count(matmul, "tile_m"),
                tile_n=reader.count(matmul, "tile_n"),
                launch_overhead_s=reader.figure(matmul, "launch_overhead_s"),
                k_overhead=k_overhead,
                peak_fraction_by_dtype=_measured_fractions(matmul, reader, peak_flop_per_s, k_overhead, sustained),
            ),
            op_records=_attention_records(device.get("attention", []), reader, sustained),
            **_host_links(device, reader),
        ),
        "intra_node_links": _intra_node_links(intra, reader, devices_per_node),
        "nic": _nic(inter, where),
        "inter_node_links": LinkMatrix(
            size=num_nodes,
            uniform=LinkProfile(
                bandwidth_bytes_per_s=reader.figure(inter, "nic_line_rate_bytes_per_s")
                * reader.figure(inter, "efficiency")
                / (reader.count(inter, "devices_per_nic") if "devices_per_nic" in inter else 1),
                latency_s=reader.figure(inter, "latency_s"),
            ),
        ),
        "collectives": _collectives(raw.get("collectives", []), reader),
        "host": _host(raw, reader),
        "provenance": Provenance(
            kind="preset",
            created=raw.get("created"),
            sources=tuple(f"{s.get('id')}: {' '.join(str(s.get('ref')).split())}" for s in sources),
        ),
    }


def _host_links(device: Mapping[str, object], reader: _PresetReader) -> dict[str, float]:
    """The device's pinned copy rates to and from its host, every device of the node copying at
    once, where the preset gives them (``host_link``); none otherwise."""
    if "host_link" not in device:
        return {}
    link = reader.section(device, "host_link")
    return {
        "host_to_device_bytes_per_s": reader.figure(link, "host_to_device_bytes_per_s"),
        "device_to_host_bytes_per_s": reader.figure(link, "device_to_host_bytes_per_s"),
    }


def _host(raw: Mapping[str, object], reader: _PresetReader) -> HostProfile | None:
    """A node's host (its memory, its CPUs' Adam rate), where the preset describes it; None otherwise."""
    if "host" not in raw:
        return None
    host = reader.section(raw, "host")
    return HostProfile(
        memory_bytes=reader.count(host, "memory_bytes"), adam_params_per_s=reader.figure(host, "adam_params_per_s")
    )


def _measured_fractions(
    matmul: Mapping[str, object],
    reader: _PresetReader,
    peaks: Mapping[DType, float],
    k_overhead: float,
    sustained: float,
) -> dict[DType, float]:
    """The GEMM peak fraction of each precision beside bf16 that the preset gives its own best
    measured rate for (``best_measured_<dtype>_flop_per_s`` at ``best_measured_<dtype>_shape_k``:
    the FP8 and MXFP8 rates, which differ from bf16's share of its peak), derated as bf16's is."""
    fractions: dict[DType, float] = {}
    for dtype, peak in peaks.items():
        key = f"best_measured_{dtype}_flop_per_s"
        if dtype is DType.BF16 or key not in matmul:
            continue
        shape_k = reader.figure(matmul, f"best_measured_{dtype}_shape_k") if k_overhead else 1.0
        fractions[dtype] = min(1.0, reader.figure(matmul, key) * (1.0 + k_overhead / shape_k) * sustained / peak)
    return fractions


_NO_LINK = "-"
"""A pair's class on the diagonal of a preset's ``pairs`` table: a device and itself."""


def _intra_node_links(intra: Mapping[str, object], reader: _PresetReader, size: int) -> LinkMatrix:
    """The links among a node's ``size`` devices: one uniform link (``bandwidth_bytes_per_s``,
    ``latency_s``), or, where pairs differ (AMD MI250X: two dies per package, Infinity Fabric
    links of different widths between packages), explicit matrices from ``link_classes`` (a name
    for each kind of path: its line ``bandwidth_bytes_per_s`` and ``latency_s``), an
    ``efficiency`` (the share of a line rate a collective reaches) and ``pairs``, the ``size`` x
    ``size`` table of class names by [src][dst], ``-`` on the diagonal (stored as 0, as the
    profiler stores the pairs it does not time)."""
    if "link_classes" not in intra:
        return LinkMatrix(
            size=size,
            uniform=LinkProfile(
                bandwidth_bytes_per_s=reader.figure(intra, "bandwidth_bytes_per_s"),
                latency_s=reader.figure(intra, "latency_s"),
            ),
        )
    where = f"{reader.where}: intra_node_link"
    classes = reader.section(intra, "link_classes")
    efficiency = reader.figure(intra, "efficiency")
    links = {
        str(name): (
            reader.figure(reader.section(classes, str(name)), "bandwidth_bytes_per_s") * efficiency,
            reader.figure(reader.section(classes, str(name)), "latency_s"),
        )
        for name in classes
    }
    rows = intra.get("pairs")
    if not (isinstance(rows, list) and len(rows) == size and all(isinstance(r, list) and len(r) == size for r in rows)):
        raise SchemaError(f"{where}.pairs must be {size} rows of {size} link class names (devices_per_node={size})")
    bandwidth: list[tuple[float, ...]] = []
    latency: list[tuple[float, ...]] = []
    for i, row in enumerate(rows):
        pairs = []
        for j, name in enumerate(row):
            if (i == j) != (name == _NO_LINK):
                raise SchemaError(f"{where}.pairs[{i}][{j}]={name!r}: write {_NO_LINK!r} on the diagonal, only there")
            if i != j and str(name) not in links:
                raise SchemaError(f"{where}.pairs[{i}][{j}]={name!r} is not one of link_classes: {', '.join(links)}")
            pairs.append((0.0, 0.0) if i == j else links[str(name)])
        bandwidth.append(tuple(b for b, _ in pairs))
        latency.append(tuple(t for _, t in pairs))
    return LinkMatrix(size=size, bandwidth_bytes_per_s=tuple(bandwidth), latency_s=tuple(latency))


def _nic(inter: Mapping[str, object], where: str) -> NicKind | None:
    """The preset's network interface type (``inter_node_link.nic``), if it names one."""
    nic = inter.get("nic")
    if nic is None:
        return None
    try:
        return NicKind(str(nic))
    except ValueError as e:
        raise SchemaError(f"{where}: inter_node_link.nic={nic!r} must be one of {', '.join(NicKind)}") from e


def _collectives(blocks: object, reader: _PresetReader) -> tuple[CollectiveRecord, ...]:
    """Published bus-bandwidth curves as records; time from busbw by the nccl-tests convention."""
    if not isinstance(blocks, list):
        raise SchemaError(f"{reader.where}: 'collectives' must be a list")
    records: list[CollectiveRecord] = []
    for i, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            raise SchemaError(f"{reader.where}: collectives[{i}] must be a mapping")
        reader.traced(block, f"collectives[{i}]")
        points = block.get("busbw_points")
        if not isinstance(points, list) or not points:
            raise SchemaError(f"{reader.where}: collectives[{i}].busbw_points must list [bytes, busbw] pairs")
        shape = {k: block.get(k) for k in ("op", "placement", "group_size", "members_per_node")}
        template = validate(CollectiveRecord, {**shape, "message_bytes": 1, "time_s": 1.0}, reader.where)
        factor = template.op.volume_factor(template.group_size)
        for point in points:
            if not (
                isinstance(point, list)
                and len(point) == 2
                and isinstance(point[0], int)
                and point[0] >= 1
                and isinstance(point[1], int | float)
                and point[1] > 0
            ):
                raise SchemaError(f"{reader.where}: collectives[{i}]: {point!r} is not [bytes >= 1, busbw > 0]")
            message_bytes, busbw = point
            update = {"message_bytes": message_bytes, "time_s": message_bytes * factor / float(busbw)}
            records.append(template.model_copy(update=update))
    return tuple(records)


_ATTENTION_TOKENS = 16384
"""Batch x sequence of a published attention point (the FlashAttention papers' benchmark setting)."""
_ATTENTION_HIDDEN = 2048
"""Heads x head dim of a published attention point (the same setting)."""
_ATTENTION_COLUMNS = {"points": 4, "forward_backward_points": 2, "causal_points": 3}
"""A block's rows: [s, causal forward, forward, backward], [s, causal forward + backward] or
[s, causal forward, causal backward], FLOP/s."""


def _attention_records(blocks: object, reader: _PresetReader, sustained: float) -> tuple[AttentionRecord, ...]:
    """Published fused-attention throughput as attention records, one per sequence length and mask.

    Rates are counted as the FlashAttention papers count them: forward 4 s^2 d heads per
    sequence, halved under a causal mask, backward 2.5 x forward. A block gives either
    ``points``, [s, causal forward, forward without mask, backward without mask]: a causal record,
    whose backward keeps the forward's causal / unmasked ratio (FlashAttention-3's paper times the
    backward without a mask only), and an unmasked one (``AttentionRecord.causal`` False, as ring
    attention's off-diagonal blocks run); or, causal records only, ``forward_backward_points``,
    [s, causal forward + backward], both passes at that rate (FlashAttention-2's paper figure for
    the A100), or ``causal_points``, [s, causal forward, causal backward] (cudnn-frontend's
    benchmark). Training sustains ``sustained`` of each rate, as of the matmul's (the papers time
    one GPU at a fixed or boost clock). ``runs_as`` names the kernel (``AttentionKernel``: flash, the default, or
    cudnn) whose rates the block gives, which ``TrainingSpec.attention_kernel`` selects.
    """
    if not isinstance(blocks, list):
        raise SchemaError(f"{reader.where}: device.attention must be a list")
    records: list[AttentionRecord] = []
    for i, block in enumerate(blocks):
        where = f"{reader.where}: device.attention[{i}]"
        if not isinstance(block, Mapping):
            raise SchemaError(f"{where} must be a mapping")
        reader.traced(block, f"device.attention[{i}]")
        head_dim = block.get("head_dim")
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or _ATTENTION_HIDDEN % head_dim:
            raise SchemaError(f"{where}: head_dim={head_dim!r} must be a whole number dividing {_ATTENTION_HIDDEN}")
        try:
            dtype = DType(str(block.get("dtype")))
        except ValueError as e:
            raise SchemaError(f"{where}: dtype={block.get('dtype')!r} must be one of {', '.join(DType)}") from e
        kernel = next((k for k in AttentionKernel if k.fused and k == block.get("runs_as", "flash")), None)
        if kernel is None:
            raise SchemaError(f"{where}: runs_as={block.get('runs_as')!r} must name a fused kernel: flash or cudnn")
        for seq_len, causal, forward, backward in _attention_rates(block, where):
            batch, heads = _ATTENTION_TOKENS // seq_len, _ATTENTION_HIDDEN // head_dim
            flop = attention_forward_flop(batch, heads, seq_len, head_dim, causal=causal)
            fwd_s = flop / (forward * sustained)
            records.append(
                AttentionRecord(
                    batch_size=batch,
                    num_attention_heads=heads,
                    seq_len=seq_len,
                    head_size=head_dim,
                    dtype=dtype,
                    kernel=kernel,
                    causal=causal,
                    fwd_time_s=fwd_s,
                    fwd_bwd_time_s=fwd_s + 2.5 * flop / (backward * sustained),
                )
            )
    return tuple(records)


def _attention_rates(block: Mapping[str, object], where: str) -> list[tuple[int, bool, float, float]]:
    """(s, causal, forward FLOP/s, backward FLOP/s) of a block's rows (``_attention_records``)."""
    given = [key for key in _ATTENTION_COLUMNS if key in block]
    if len(given) != 1:
        raise SchemaError(f"{where} needs exactly one of {', '.join(_ATTENTION_COLUMNS)}")
    key = given[0]
    columns, rows = _ATTENTION_COLUMNS[key], block[key]
    if not isinstance(rows, list) or not rows:
        raise SchemaError(f"{where}: {key} must list rows of {columns} numbers")
    rates = []
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == columns
            and isinstance(row[0], int)
            and 1 <= row[0] <= _ATTENTION_TOKENS
            and all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in row[1:])
        ):
            raise SchemaError(
                f"{where}: {row!r} is not [seq_len in 1..{_ATTENTION_TOKENS}, {columns - 1} FLOP/s > 0] ({key})"
            )
        if columns == 4:
            seq_len, causal_forward, forward, backward = row
            rates.append((seq_len, True, float(causal_forward), backward * causal_forward / forward))
            rates.append((seq_len, False, float(forward), float(backward)))
        elif columns == 3:
            seq_len, causal_forward, causal_backward = row
            rates.append((seq_len, True, float(causal_forward), float(causal_backward)))
        else:
            seq_len, both = row
            rates.append((seq_len, True, float(both), float(both)))
    return rates
