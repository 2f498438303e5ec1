"""Loading the planner's inputs: models and clusters, by preset name or from files.

Library API, pure apart from reading files:

- ``load_model(spec)``: a model preset name, or a Hugging Face ``config.json`` / our YAML file.
- ``model_from_dict(raw, name=...)``: the same from an already parsed mapping.
- ``load_cluster(spec)``: a cluster preset ``NAME:NODES`` (e.g. ``dgx-a100-80g:16``), presets mixed
  (``dgx-a100-80g:4+dgx-h100:4``), or a profile JSON.
- ``cluster_preset(name, num_nodes)``: a ClusterProfile built from a preset's published figures.
- ``save_cluster(profile, path)``: write a profile as JSON, as the profiler does.
- ``list_model_presets()``, ``list_cluster_presets()``.

Presets ship as package data under ``planner/presets/{models,clusters}/<name>.yaml`` and are read
with importlib.resources. Every error a user can cause is a SchemaError naming the value and the fix.
"""

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from planner.cluster_mix import MIX_SEPARATOR, mix_clusters
from planner.hf_config import spec_values
from planner.schemas import (
    AttentionKernel,
    AttentionRecord,
    ClusterProfile,
    CollectiveRecord,
    DeviceKind,
    DeviceProfile,
    DType,
    LinkMatrix,
    LinkProfile,
    MatmulModel,
    ModelSpec,
    Provenance,
)
from planner.schemas.bounds import MAX_DEVICES
from planner.schemas.cluster import CLUSTER_SCHEMA_VERSION, READABLE_VERSIONS, NicKind, upgrade
from planner.schemas.errors import SchemaError
from planner.schemas.op_records import attention_forward_flop

MODEL_FILE_SUFFIXES = (".json", ".yaml", ".yml")

_M = TypeVar("_M", bound=BaseModel)


def list_model_presets() -> tuple[str, ...]:
    """Names of the packaged model presets, sorted."""
    return _list_presets("models")


def list_cluster_presets() -> tuple[str, ...]:
    """Names of the packaged cluster presets, sorted."""
    return _list_presets("clusters")


def model_from_dict(raw: Mapping[str, object], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` mapping or our YAML.

    Reads the ModelSpec keys under Hugging Face's names and the other families' spellings of them
    (GPT-2, Falcon, Gemma, Llama 4, Qwen, DeepSeek, a multimodal config's ``text_config``), as
    transformers builds those models: ``planner.hf_config``. Encoders and encoder-decoders are
    refused. Other keys are logged at DEBUG and ignored, unless one looks like a misspelling of a
    key that is read.

    Args:
        raw: the parsed file.
        name: the model's display name (preset name or file stem), used in messages.

    Returns:
        The validated ModelSpec.

    Raises:
        SchemaError: a misspelled, missing or invalid key, naming it, its value and what is expected.
    """
    if not isinstance(raw, Mapping):
        raise SchemaError(f"model {name!r} must be a mapping of keys to values, not {type(raw).__name__}")
    values = spec_values(raw, name)
    _reject_coercions(values, name)
    return _validate(ModelSpec, {"name": name, **values}, f"model {name!r}")


def load_model(spec: str) -> ModelSpec:
    """Load a model: a preset name, or a path to a ``.json``/``.yaml``/``.yml`` file.

    Raises:
        SchemaError: unknown preset, missing or malformed file, or an invalid model.
    """
    presets = list_model_presets()
    preset = _preset_named(spec, presets)
    if preset is not None:
        return model_from_dict(_read_preset("models", preset), name=preset)
    path = Path(spec)
    hint = (
        f"give a model preset ({', '.join(presets)}) or a path to a model file ending in "
        f"{', '.join(MODEL_FILE_SUFFIXES)}"
    )
    if path.suffix.lower() not in MODEL_FILE_SUFFIXES:
        raise SchemaError(f"unknown model {spec!r}{_did_you_mean(spec, presets)}: {hint}")
    if not path.is_file():
        raise SchemaError(f"model file {spec!r} does not exist: {hint}")
    # A Hugging Face checkout names its file config.json; its folder names the model.
    stem = path.resolve().parent.name if path.stem == "config" and path.resolve().parent.name else path.stem
    return model_from_dict(_read_mapping_file(path), name=stem)


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
    preset = _preset_named(name, presets)
    if preset is None:
        raise SchemaError(
            f"unknown cluster preset {name!r}{_did_you_mean(name, presets)}; presets: {', '.join(presets)}"
        )
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise SchemaError(f"num_nodes={num_nodes!r} must be a whole number >= 1")
    if num_nodes > MAX_DEVICES:  # before its node matrix is built; ClusterProfile bounds the devices
        raise SchemaError(
            f"cluster preset {preset!r}: num_nodes={num_nodes} is more than any cluster this planner plans "
            f"(at most {MAX_DEVICES:,} devices)"
        )
    return _build_cluster(_read_preset("clusters", preset), name=preset, num_nodes=num_nodes)


def load_cluster(spec: str) -> ClusterProfile:
    """Load a cluster: a preset ``NAME:NODES`` (e.g. ``dgx-a100-80g:16``), a mixed cluster of presets
    joined by ``+`` (``dgx-a100-80g:4+dgx-h100:4``: ``planner.cluster_mix``), or a path to a profile JSON.

    Raises:
        SchemaError: a malformed spec, unknown preset, missing or malformed file, or an invalid profile.
    """
    presets = list_cluster_presets()
    example = f"{presets[0]}:16" if presets else "NAME:16"
    form = (
        f"expected NAME:NODES with NAME one of {', '.join(presets)} (e.g. {example}), parts of a mixed cluster "
        f"joined by {MIX_SEPARATOR} (e.g. dgx-a100-80g:4{MIX_SEPARATOR}dgx-h100:4), or a path to a profile .json"
    )
    path = Path(spec)
    if path.suffix.lower() == ".json" or path.is_file():
        if not path.is_file():
            raise SchemaError(f"cluster profile file {spec!r} does not exist; {form}")
        return _load_cluster_file(path)
    if MIX_SEPARATOR in spec:
        return mix_clusters([_preset_part(part, spec, presets, form) for part in spec.split(MIX_SEPARATOR)], spec=spec)
    return _preset_part(spec, spec, presets, form)


def _preset_part(part: str, spec: str, presets: tuple[str, ...], form: str) -> ClusterProfile:
    """One ``NAME:NODES`` of a cluster spec (the whole spec, or one part of a mixed one)."""
    given, colon, nodes = part.partition(":")
    name = _preset_named(given, presets)
    if not colon:
        if name is not None:
            raise SchemaError(f"cluster {spec!r} needs a node count: write {name}:NODES, e.g. {name}:16")
        raise SchemaError(
            f"cluster {spec!r} is neither a preset nor an existing file{_did_you_mean(given, presets)}; {form}"
        )
    if name is None:
        raise SchemaError(f"unknown cluster preset {given!r} in {spec!r}{_did_you_mean(given, presets)}; {form}")
    if not (nodes.isascii() and nodes.isdigit()) or int(nodes) < 1:
        raise SchemaError(f"cluster {spec!r}: NODES={nodes!r} must be a whole number >= 1, as in {name}:16")
    return cluster_preset(name, int(nodes))


def save_cluster(profile: ClusterProfile, path: str | Path) -> None:
    """Write ``profile`` to ``path`` as JSON (indent 2), readable by ``load_cluster``.

    Raises:
        SchemaError: the file cannot be written.
    """
    try:
        Path(path).write_text(profile.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise SchemaError(f"cannot write cluster profile to {str(path)!r}: {e.strerror}") from e


# --- models ---------------------------------------------------------------------------------------


def _reject_coercions(values: Mapping[str, object], name: str) -> None:
    """pydantic would read true as 1 and "yes" as true; a model file must say what it means."""
    for key, value in values.items():
        annotation = ModelSpec.model_fields[key].annotation
        if get_origin(annotation) is tuple:  # a list of whole numbers (mlp_only_layers)
            if isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                continue
            raise SchemaError(f"model {name!r}: {key}={value!r} must be a list of whole numbers")
        kinds = set(get_args(annotation)) or {annotation}
        if value is None and type(None) in kinds:
            continue
        if int in kinds and (isinstance(value, bool) or not isinstance(value, int)):
            expected = "a whole number"
        elif bool in kinds and not isinstance(value, bool):
            expected = "true or false"
        elif float in kinds and (isinstance(value, bool) or not isinstance(value, int | float)):
            expected = "a number"
        else:
            continue
        raise SchemaError(f"model {name!r}: {key}={value!r} must be {expected}")


# --- clusters -------------------------------------------------------------------------------------


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
        raise SchemaError(_describe(e, where, None)) from e
    return _validate(ClusterProfile, fields, where)


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
        raise SchemaError(f"{where}: peak_flop_per_s needs bf16 and only bf16/fp16/fp32 keys ({e})") from e
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
            ),
            op_records=_attention_records(device.get("attention", []), reader, sustained),
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
        "provenance": Provenance(
            kind="preset",
            created=raw.get("created"),
            sources=tuple(f"{s.get('id')}: {' '.join(str(s.get('ref')).split())}" for s in sources),
        ),
    }


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
        template = _validate(CollectiveRecord, {**shape, "message_bytes": 1, "time_s": 1.0}, reader.where)
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


def _load_cluster_file(path: Path) -> ClusterProfile:
    text = _read_text(path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if isinstance(raw, dict) and raw.get("complete") is False:
        raise SchemaError(
            f"{path} is an incomplete profile ({raw.get('failure', 'no reason recorded')}); "
            "run `planner profile` again once every rank is healthy"
        )
    where = f"cluster profile {str(path)!r}"
    version = raw.get("schema_version", 1) if isinstance(raw, dict) else None
    if version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise SchemaError(
            f"{where}: schema_version {version!r} is not one this planner reads ({readable}; it writes "
            f"{CLUSTER_SCHEMA_VERSION}); profile the cluster again with `planner profile`"
        )
    try:
        if version == CLUSTER_SCHEMA_VERSION:
            return ClusterProfile.model_validate_json(text)
        return ClusterProfile.model_validate(upgrade(raw))
    except ValidationError as e:
        raise SchemaError(_describe(e, where, ClusterProfile)) from e
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from e


# --- files and validation -------------------------------------------------------------------------


def _preset_dir(kind: str) -> Traversable:
    return resources.files("planner") / "presets" / kind


def _list_presets(kind: str) -> tuple[str, ...]:
    folder = _preset_dir(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")))


def _preset_named(spec: str, presets: tuple[str, ...]) -> str | None:
    """The preset ``spec`` names, whatever its case (``Llama3-8B`` is ``llama3-8b``), or None."""
    return next((preset for preset in presets if preset.casefold() == spec.casefold()), None)


def _did_you_mean(spec: str, presets: tuple[str, ...]) -> str:
    """``" (did you mean 'llama3-8b'?)"`` for the preset closest to ``spec``, or "" if none is close."""
    close = difflib.get_close_matches(spec.casefold(), presets, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_preset(kind: str, name: str) -> Mapping[str, object]:
    resource = _preset_dir(kind) / f"{name}.yaml"
    return _parse(resource.read_text(encoding="utf-8"), f"preset {kind}/{name}.yaml", as_json=False)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SchemaError(f"cannot read {str(path)!r}: {e}") from e


def _read_mapping_file(path: Path) -> Mapping[str, object]:
    return _parse(_read_text(path), str(path), as_json=path.suffix.lower() == ".json")


def _parse(text: str, where: str, *, as_json: bool) -> Mapping[str, object]:
    """Parse JSON or YAML text into a mapping, naming the file and line of a syntax error."""
    try:
        data = json.loads(text) if as_json else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SchemaError(f"{where}: malformed YAML{at}: {problem}") from e
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: the top level must be a mapping, not {type(data).__name__}")
    return data


def _validate(model: type[_M], values: Mapping[str, object], what: str) -> _M:
    """``model.model_validate(values)`` with pydantic's errors turned into one SchemaError."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        raise SchemaError(_describe(e, what, model)) from e
    except SchemaError as e:
        raise SchemaError(f"{what}: {e}") from e


def _describe(error: ValidationError, what: str, model: type[BaseModel] | None) -> str:
    """One line per problem: the key, the bad value, what is expected."""
    lines = []
    for problem in error.errors():
        loc = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        field = model.model_fields.get(str(problem["loc"][0])) if model and problem["loc"] else None
        about = f" ({field.description})" if field is not None and field.description else ""
        if problem["type"] == "missing":
            lines.append(f"missing required key {loc!r}{about}")
        else:
            lines.append(f"{loc}={problem['input']!r}: {problem['msg']}{about}")
    if len(lines) == 1:
        return f"{what}: {lines[0]}"
    return f"{what} has {len(lines)} problems:\n" + "\n".join(f"  {line}" for line in lines)
