"""ClusterProfile: the devices and links of a cluster, measured or built from published figures.

Links are stored hierarchically (design.md): a device matrix inside each node and one node
matrix across nodes, each in its most compact form (``schemas.links``). Nodes alike share the
defaults; nodes that differ (their devices, intra-node links, network interface type or
intra-node collective curves) are named in ``node_overrides``, so that 10,000+ devices stay small.

Written to disk as JSON (``planner.files.clusters.save_cluster``); a schema change bumps
``schema_version`` and keeps a reader for the old one (``upgrade``).

Versions: 1, the device known by its name and op records with a positional ``shape``; 2 adds
the device's ``kind`` and names each op record's fields (``planner.schemas.op_records``); 3 adds
the ``moe_layer`` record (an MoE model's layer as the runtime builds it), which a version-2
profile lacks: its MoE layers are priced as before, from the dense ``layer`` record; 4 adds
per-node descriptions (``node_overrides``), the network interface type (``nic``) and links
given per endpoint (``LinkMatrix.endpoints``), which a version-3 profile lacks: every node alike;
5 says which links each collective record ran over (``CollectiveRecord.ring_bandwidth_bytes_per_s``);
6 adds each measured pair's duplex bandwidth (``LinkMatrix.duplex_bandwidth_bytes_per_s``), which
a version-5 profile lacks: its links are read as full duplex; 7 adds the GEMM's per-tile
cost beside its loop over k (``MatmulModel.k_overhead``), which a version-6 profile lacks: 0,
its GEMMs priced as before; 8 says which fused kernel each attention record timed
(``AttentionRecord.kernel``), which a version-7 profile lacks: flash; 9 says whether it timed
attention under a causal mask or without one (``AttentionRecord.causal``), which a version-8
profile lacks: causal, the only kind it held; 10 adds the GEMM efficiency measured in each
precision (``MatmulModel.peak_fraction_by_dtype``), the device memory the kernel libraries took
(``DeviceProfile.workspace_bytes``) and what a profile could not measure
(``Provenance.not_measured``), which a version-9 profile lacks: one efficiency for every
precision, an unmeasured workspace, everything measured.
"""

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Literal, Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.bounds import MAX_DEVICES
from planner.schemas.calibration import Calibration
from planner.schemas.enums import CollectiveOp, DType, Placement
from planner.schemas.errors import SchemaError
from planner.schemas.links import LinkMatrix, LinkProfile
from planner.schemas.op_records import OpRecord, record_from_v1


class DeviceKind(StrEnum):
    """What a rank computes on, as the profiler found it (``torch.version.hip`` tells ROCm from CUDA)."""

    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"


def device_kind_of_v1_name(name: str) -> DeviceKind:
    """The kind of a device that a version-1 file (profile or plan) knew only by its name.

    The one place a device name is read: ``planner profile`` named a CPU rank "cpu (<model>)",
    and torch names an AMD GPU "AMD Instinct ..."; the planner treated every other device as CUDA.
    """
    lowered = name.lower()
    if "cpu" in lowered:
        return DeviceKind.CPU
    return DeviceKind.ROCM if "amd" in lowered else DeviceKind.CUDA


class MatmulModel(FrozenModel):
    """Achievable GEMM throughput as a function of shape, for shapes nobody measured.

    Time of an (m x k) @ (k x n) GEMM = launch overhead + 2mnk / (peak * peak_fraction * wave
    efficiency), where wave efficiency is the fraction of the last wave of output tiles that
    does useful work: tiles = ceil(m/tile_m) * ceil(n/tile_n) spread over compute_units
    (NVIDIA, "Matrix Multiplication Background User's Guide", tile and wave quantization).
    Each output tile also pays a fixed cost beside its loop over k (filling its pipeline,
    writing its result), which ``k_overhead`` states as the k that loop would run in that time:
    the compute time is multiplied by 1 + k_overhead / k, so a short reduction runs below the
    rate of a long one.
    """

    peak_fraction: float = Field(
        gt=0,
        le=1,
        description="Best GEMM FLOP/s sustained under training load (power-limited) / peak FLOP/s; with a"
        " k_overhead, the rate of an unbounded k.",
    )
    compute_units: int = Field(ge=1, description="Streaming multiprocessors, or cores on a CPU.")
    tile_m: int = Field(ge=1, description="Output tile rows of the GEMM kernel.")
    tile_n: int = Field(ge=1, description="Output tile columns of the GEMM kernel.")
    launch_overhead_s: float = Field(ge=0, description="Fixed cost per kernel.")
    k_overhead: float = Field(
        default=0.0,
        ge=0,
        description="Per-tile cost beside the loop over k, in elements of k: compute time x (1 + k_overhead / k).",
    )
    peak_fraction_by_dtype: dict[DType, float] = Field(
        default_factory=dict,
        description="peak_fraction as measured in each precision the profiler timed GEMMs in (its best GEMM"
        " rate in that precision / the peak in it); a precision absent here is priced at peak_fraction.",
    )

    @model_validator(mode="after")
    def _check_fractions(self) -> Self:
        for dtype, fraction in self.peak_fraction_by_dtype.items():
            if not 0 < fraction <= 1:
                raise SchemaError(
                    f"matmul.peak_fraction_by_dtype.{dtype}={fraction!r} must be in (0, 1] (best GEMM rate / peak "
                    "in that precision); fix it or leave the precision out"
                )
        return self

    def fraction(self, dtype: DType) -> float:
        """The share of the peak GEMMs in ``dtype`` sustain: measured in that precision where the
        profile timed it, else ``peak_fraction``. Precisions differ (on an H100 fp32 runs on CUDA
        cores, bf16 on tensor cores), so one precision's fraction misprices another's."""
        return self.peak_fraction_by_dtype.get(dtype, self.peak_fraction)


class MatmulRecord(FrozenModel):
    """One measured GEMM: (m x k) @ (k x n) in ``dtype`` took ``time_s``."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: DType
    time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")


class DeviceProfile(FrozenModel):
    """One type of accelerator (or a CPU rank): every device of the nodes it describes."""

    name: str
    kind: DeviceKind
    memory_bytes: int = Field(ge=1, description="Memory one rank may use.")
    peak_flop_per_s: dict[DType, float] = Field(description="Dense peak by dtype.")
    memory_bandwidth_bytes_per_s: float = Field(
        gt=0, description="Achievable memory bandwidth, which bounds elementwise kernels."
    )
    matmul: MatmulModel
    matmul_records: tuple[MatmulRecord, ...] = Field(default=(), description="Measured GEMMs, preferred.")
    op_records: tuple[OpRecord, ...] = Field(
        default=(), description="Measured attention, normalization, elementwise and whole-layer times."
    )
    core_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Share of a compute unit each rank gets while every rank of its node computes: 1 for "
        "accelerators; below 1 for CPU ranks that outnumber their node's cores (4 ranks on 2 cores: 0.5). "
        "Times are measured with every rank busy; a rank runs up to 1/core_share faster while others wait.",
    )
    host_to_device_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Pinned host memory to this device, every rank of the node copying at once, as the"
        " profiler measured it on a GPU (what offloading moves over); None: not measured.",
    )
    device_to_host_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="This device to pinned host memory, measured as host_to_device_bytes_per_s is.",
    )
    workspace_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Device memory the GEMM and attention libraries took beyond tensors (their handles and"
        " workspaces: the driver's used memory grown over the first GEMMs and attention calls, less the"
        " tensors allocated), as the profiler measured it on a GPU; None: not measured (presets, CPUs).",
    )

    @model_validator(mode="after")
    def _check_peaks(self) -> Self:
        for dtype, peak in self.peak_flop_per_s.items():
            if peak <= 0:
                raise SchemaError(
                    f"device {self.name!r}: peak_flop_per_s.{dtype}={peak!r} must be > 0 (FLOP/s); give the "
                    "device's dense peak in that precision, or leave the precision out"
                )
        return self

    def get_peak_flop_per_s(self, dtype: DType) -> float:
        """Peak FLOP/s for ``dtype``; raises SchemaError when the profile lacks it."""
        try:
            return self.peak_flop_per_s[dtype]
        except KeyError as e:
            have = ", ".join(sorted(str(d) for d in self.peak_flop_per_s))
            raise SchemaError(
                f"device {self.name!r} has no peak FLOP/s for dtype {dtype}; it has: {have}. Plan in one of "
                f"those (--dtype), or profile the cluster in {dtype} too (planner profile without --dtype)"
            ) from e


class CollectiveRecord(FrozenModel):
    """One measured (or published) collective: ``op`` over a group of ``group_size`` ranks took ``time_s``."""

    op: CollectiveOp
    placement: Placement
    group_size: int = Field(ge=2)
    members_per_node: int = Field(ge=1, description="Group members that share a node.")
    message_bytes: int = Field(ge=1, description="Bytes of the full buffer (nccl-tests 'size').")
    time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")
    ring_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "The slowest link along the rings the measured groups ran at this placement (between "
            "consecutive members inside a node for an intra-node record, between consecutive nodes "
            "for an inter-node one), from the profile's own link figures: what bounds the record's "
            "bus bandwidth. A group whose ring runs over other links is priced from the record scaled "
            "by its own ring's slowest link. None (presets, profiles before version 5): the record "
            "stands for every group of its shape."
        ),
    )


class Provenance(FrozenModel):
    """Where a profile's numbers come from."""

    kind: Literal["preset", "measured"]
    created: datetime
    sources: tuple[str, ...] = Field(default=(), description="Publications or settings behind the figures.")
    torch_version: str | None = None
    backend: str | None = None
    hosts: tuple[str, ...] = ()
    settings: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="How a measured profile was taken (sizes, repeats, timeout)."
    )
    not_measured: tuple[str, ...] = Field(
        default=(),
        description="What a measured profile could not measure, each with why (a one-rank job has no link,"
        " collective or tensor-parallel group): it prices only layouts that need none of them.",
    )


class NicKind(StrEnum):
    """A node's network interface type. Descriptive: the node matrix (``inter_node_links``) is what
    the cost model prices, measured or taken from the interface's published rate."""

    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"


class HostProfile(FrozenModel):
    """A node's host: the memory an offloaded optimizer's states fill, and the CPUs that step them
    (``Layout.optimizer_offload_fraction``; the links to it are each device's
    ``host_to_device_bytes_per_s`` and ``device_to_host_bytes_per_s``)."""

    memory_bytes: int = Field(ge=1, description="Host memory of one node (every rank's offloaded states share it).")
    adam_params_per_s: float = Field(
        gt=0,
        description="Parameters per second the node's CPUs step with AdamW on fp32 master weights and"
        " moments, every rank of the node stepping its share at once on the node's cores split over"
        " its ranks, as `planner run` splits them (they share the cores and the memory bandwidth).",
    )


class NodeOverride(FrozenModel):
    """What differs on some nodes from the cluster's defaults (``ClusterProfile.device``,
    ``intra_node_links``, ``nic`` and intra-node ``collectives``); a field left unset keeps the default."""

    nodes: tuple[int, ...] = Field(min_length=1, description="The nodes (0-based, ascending) this applies to.")
    device: DeviceProfile | None = Field(default=None, description="These nodes' devices, of another type.")
    intra_node_links: LinkMatrix | None = Field(default=None, description="Device-to-device links inside each of them.")
    nic: NicKind | None = Field(default=None, description="Their network interface type.")
    collectives: tuple[CollectiveRecord, ...] | None = Field(
        default=None, description="Intra-node collective curves measured or published for these nodes."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if list(self.nodes) != sorted(set(self.nodes)) or self.nodes[0] < 0:
            raise SchemaError(
                f"node_overrides nodes {list(self.nodes)[:16]} must be distinct node numbers >= 0, ascending"
            )
        if self.device is None and self.intra_node_links is None and self.nic is None and self.collectives is None:
            raise SchemaError(
                f"a node override for nodes {list(self.nodes)[:16]} changes nothing; set device, intra_node_links, "
                "nic or collectives, or remove it"
            )
        for record in self.collectives or ():
            if record.placement is not Placement.INTRA_NODE:
                raise SchemaError(
                    f"node override collectives hold a {record.placement} {record.op} record; a node's own "
                    "records are intra_node ones (put records across nodes in the cluster's collectives)"
                )
        return self


def _sustained_flop_per_s(device: DeviceProfile) -> float:
    """A device's sustained GEMM rate in bf16 (else its fastest dtype), which orders devices by speed."""
    peaks = device.peak_flop_per_s
    dtype = DType.BF16 if DType.BF16 in peaks else max(peaks, key=lambda d: peaks[d], default=DType.BF16)
    return peaks.get(dtype, 0.0) * device.matmul.fraction(dtype)


class ClusterProfile(FrozenModel):
    """A cluster of ``num_nodes`` nodes of ``devices_per_node`` devices each.

    Every node has the default ``device``, ``intra_node_links``, ``nic`` and intra-node
    ``collectives`` unless one of ``node_overrides`` names it (the per-node accessors below read
    the right one). A cluster described uniformly stays as small as one node's description.
    """

    __slots__ = ("_node_memo",)

    schema_version: Literal[12] = 12
    name: str
    num_nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1, description="Devices of every node (the same on each).")
    device: DeviceProfile = Field(description="Every node's devices unless a node override gives others.")
    intra_node_links: LinkMatrix = Field(description="Device-to-device links inside every node not overridden.")
    nic: NicKind | None = Field(default=None, description="Every node's network interface type; None: not known.")
    inter_node_links: LinkMatrix = Field(
        description="Node-to-node links, per device's own network interface (one rail)."
    )
    node_overrides: tuple[NodeOverride, ...] = Field(
        default=(), description="Nodes whose devices, links, interface or intra-node collectives differ."
    )
    collectives: tuple[CollectiveRecord, ...] = Field(default=(), description="Measured collective curves.")
    host: HostProfile | None = Field(
        default=None, description="Every node's host, where optimizer states may be offloaded; None: not known."
    )
    provenance: Provenance
    calibration: Calibration | None = Field(
        default=None, description="Correction factors fitted from measured runs (planner tune); None: uncalibrated."
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> Self:
        if self.world_size > MAX_DEVICES:
            raise SchemaError(
                f"num_nodes={self.num_nodes} x devices_per_node={self.devices_per_node} = {self.world_size:,} devices "
                f"is more than any cluster this planner plans (at most {MAX_DEVICES:,}); fix the counts"
            )
        if self.intra_node_links.size != self.devices_per_node:
            raise SchemaError(
                f"intra_node_links.size={self.intra_node_links.size} must equal "
                f"devices_per_node={self.devices_per_node}"
            )
        if self.inter_node_links.size != self.num_nodes:
            raise SchemaError(
                f"inter_node_links.size={self.inter_node_links.size} must equal num_nodes={self.num_nodes}"
            )
        seen: set[int] = set()
        for i, override in enumerate(self.node_overrides):
            where = f"node_overrides[{i}]"
            if override.nodes[-1] >= self.num_nodes:
                raise SchemaError(
                    f"{where} names node {override.nodes[-1]}, but the cluster has num_nodes={self.num_nodes} "
                    f"(nodes 0..{self.num_nodes - 1}); drop it or raise num_nodes"
                )
            twice = seen.intersection(override.nodes)
            if twice:
                raise SchemaError(f"{where} names node {min(twice)} again; give each node at most one override")
            seen.update(override.nodes)
            links = override.intra_node_links
            if links is not None and links.size != self.devices_per_node:
                raise SchemaError(
                    f"{where}.intra_node_links.size={links.size} must equal devices_per_node={self.devices_per_node} "
                    "(every node has the same number of devices)"
                )
        return self

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.num_nodes * self.devices_per_node

    def _memo(self) -> tuple[tuple[int, ...], DeviceProfile, tuple[int, ...] | None]:
        """(each node's override index or -1, the pricing device, the node classes), computed once
        per object (a slot, as ``FrozenModel``'s hash: copies compute their own)."""
        memo: tuple[tuple[int, ...], DeviceProfile, tuple[int, ...] | None] | None = getattr(self, "_node_memo", None)
        if memo is None:
            index = [-1] * self.num_nodes
            for i, override in enumerate(self.node_overrides):
                for node in override.nodes:
                    index[node] = i
            memo = (tuple(index), self._slowest_device(), self._classes(index))
            object.__setattr__(self, "_node_memo", memo)
        return memo

    def _classes(self, index: list[int]) -> tuple[int, ...] | None:
        rails = self.inter_node_links.endpoints
        if self.inter_node_links.uniform is None and rails is None:
            return None
        numbered: dict[tuple[int, LinkProfile | None], int] = {}
        return tuple(
            numbered.setdefault((index[n], rails[n] if rails is not None else None), len(numbered))
            for n in range(self.num_nodes)
        )

    @property
    def node_classes(self) -> tuple[int, ...] | None:
        """A class number per node, alike for nodes described alike: the same override (or none)
        and the same rail where the node matrix is given per endpoint; None where the node matrix
        is explicit (every node pair its own link)."""
        return self._memo()[2]

    def node_override(self, node: int) -> NodeOverride | None:
        """The override naming ``node``, if any."""
        i = self._memo()[0][node] if self.node_overrides else -1
        return self.node_overrides[i] if i >= 0 else None

    def node_device(self, node: int) -> DeviceProfile:
        """The devices of ``node``."""
        override = self.node_override(node)
        return override.device if override is not None and override.device is not None else self.device

    def node_links(self, node: int) -> LinkMatrix:
        """The device-to-device links inside ``node``."""
        override = self.node_override(node)
        if override is not None and override.intra_node_links is not None:
            return override.intra_node_links
        return self.intra_node_links

    def node_nic(self, node: int) -> NicKind | None:
        """The network interface type of ``node`` (None: not known)."""
        override = self.node_override(node)
        return override.nic if override is not None and override.nic is not None else self.nic

    def node_collectives(self, node: int) -> tuple[CollectiveRecord, ...]:
        """The collective records that price a phase inside ``node``: its override's, else the cluster's."""
        override = self.node_override(node)
        if override is not None and override.collectives is not None:
            return override.collectives
        return self.collectives

    @property
    def devices(self) -> tuple[DeviceProfile, ...]:
        """The distinct device types, the default first."""
        found = [self.device]
        for override in self.node_overrides:
            if override.device is not None and override.device not in found:
                found.append(override.device)
        return tuple(found)

    @property
    def has_mixed_devices(self) -> bool:
        """Whether some nodes hold devices of another type than the default."""
        return len(self.devices) > 1

    @property
    def pricing_device(self) -> DeviceProfile:
        """The device that prices what the whole cluster runs in lockstep: ``device`` when all are
        alike; on mixed devices the slowest type with the smallest memory (``slowest_device``).
        The cost model prices each pipeline stage on its own ranks' devices instead
        (``cost_models.stage_devices``), so a stage wholly on faster nodes runs at their pace."""
        return self._memo()[1] if self.node_overrides else self.device

    def _slowest_device(self) -> DeviceProfile:
        return slowest_device(self.devices)

    def priced_on(self, device: DeviceProfile) -> "ClusterProfile":
        """This cluster with ``device`` on every node: the same links, interfaces and collective
        curves, so that the cost model prices a part of it (a pipeline stage) on that part's
        devices. Its ``pricing_device`` is ``device``."""
        kept = (o.model_copy(update={"device": None}) for o in self.node_overrides)
        overrides = tuple(o for o in kept if o.intra_node_links or o.nic or o.collectives is not None)
        return self.model_copy(update={"device": device, "node_overrides": overrides})


def slowest_device(devices: tuple[DeviceProfile, ...]) -> DeviceProfile:
    """The device a group of ``devices`` (one or more types) runs at in lockstep: the slowest type
    (lowest sustained bf16 GEMM rate, all of its rates and measured records) with the smallest
    memory of any; the one device itself when they are alike."""
    if len(devices) == 1:
        return devices[0]
    slowest = min(devices, key=_sustained_flop_per_s)
    smallest = min(d.memory_bytes for d in devices)
    if slowest.memory_bytes == smallest:
        return slowest
    return slowest.model_copy(update={"memory_bytes": smallest})


CLUSTER_SCHEMA_VERSION = 12
"""The version this planner writes."""
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
"""The versions ``upgrade`` reads."""


def upgrade(raw: Mapping[str, object]) -> dict[str, object]:
    """A cluster profile's JSON object of any readable version as the current version's.

    Version 1 -> 2: the device's kind, derived once from its name (``device_kind_of_v1_name``),
    and each op record's positional shape as named fields (``op_records.record_from_v1``).
    Version 2 -> 3: nothing to change; a version-2 profile holds no ``moe_layer`` record.
    Version 3 -> 4: nothing to change; a version-3 profile describes every node alike (no
    ``node_overrides``, no ``nic``), which version 4 reads as it did.
    Version 4 -> 5: nothing to change; a version-4 profile's collective records do not say which
    links their groups ran over, which version 5 reads as records that stand for every group.
    Version 5 -> 6: nothing to change; a version-5 profile's links hold no duplex figures, which
    version 6 reads as full duplex links.
    Version 6 -> 7: nothing to change; a version-6 profile's matmul model has no ``k_overhead``,
    which version 7 reads as 0 (its GEMMs priced as before).
    Version 7 -> 8: nothing to change; a version-7 profile's attention records do not say which
    fused kernel they timed, which version 8 reads as flash (what the profiler's SDPA and the
    presets' FlashAttention-2 figures were).
    Version 8 -> 9: nothing to change; a version-8 profile's attention records do not say whether
    they were causal, which version 9 reads as causal (the profiler timed causal attention only,
    and the presets' records were causal).
    Version 9 -> 10: nothing to change; a version-9 profile has one GEMM efficiency for every
    precision (no ``peak_fraction_by_dtype``), no measured workspace and no ``not_measured``, which
    version 10 reads as it did.
    Version 10 -> 11: nothing to change; a version-10 profile holds no fp8 or mxfp8 peak (no FP8
    tensor cores as far as it says), which version 11 reads as it did.
    Version 11 -> 12: nothing to change; a version-11 profile says nothing of its nodes' hosts (no
    ``host``), which version 12 reads as a cluster whose optimizer states stay on its devices.

    Raises:
        SchemaError: a version-1 device or op record that cannot be read, naming it.
    """
    version = raw.get("schema_version", 1)
    if version in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11):
        return {**raw, "schema_version": 12}
    if version != 1:
        return dict(raw)
    device = raw.get("device")
    if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
        raise SchemaError(f"'device' must be a mapping with a 'name', got {device!r}")
    records = device.get("op_records", [])
    if not isinstance(records, list | tuple):
        raise SchemaError(f"device.op_records must be a list, got {records!r}")
    upgraded = {
        **device,
        "kind": device_kind_of_v1_name(device["name"]),
        "op_records": [record_from_v1(r, f"device.op_records[{i}]") for i, r in enumerate(records)],
    }
    return upgrade({**raw, "schema_version": 2, "device": upgraded})
