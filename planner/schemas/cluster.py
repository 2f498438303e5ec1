"""ClusterProfile: the devices and links of a cluster, measured or built from published figures.

Links are stored hierarchically (design.md): one device matrix shared by every node and one
node matrix across nodes, each either uniform or explicit, so that 10,000+ devices stay small.

Written to disk as JSON (``planner.inputs.save_cluster``); a schema change bumps
``schema_version`` and keeps a reader for the old one (``upgrade``).

Versions: 1, the device known by its name and op records with a positional ``shape``; 2 adds
the device's ``kind`` and names each op record's fields (``planner.schemas.op_records``); 3 adds
the ``moe_layer`` record (an MoE model's layer as the runtime builds it), which a version-2
profile lacks: its MoE layers are priced as before, from the dense ``layer`` record.
"""

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Literal, Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.calibration import Calibration
from planner.schemas.enums import CollectiveOp, DType, Placement
from planner.schemas.errors import SchemaError
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
    """

    peak_fraction: float = Field(
        gt=0, le=1, description="Best GEMM FLOP/s sustained under training load (power-limited) / peak FLOP/s."
    )
    compute_units: int = Field(ge=1, description="Streaming multiprocessors, or cores on a CPU.")
    tile_m: int = Field(ge=1, description="Output tile rows of the GEMM kernel.")
    tile_n: int = Field(ge=1, description="Output tile columns of the GEMM kernel.")
    launch_overhead_s: float = Field(ge=0, description="Fixed cost per kernel.")


class MatmulRecord(FrozenModel):
    """One measured GEMM: (m x k) @ (k x n) in ``dtype`` took ``time_s``."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: DType
    time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")


class DeviceProfile(FrozenModel):
    """One accelerator (or one CPU rank) of a homogeneous cluster."""

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


class LinkProfile(FrozenModel):
    """A point-to-point link: time(bytes) = latency_s + bytes / bandwidth_bytes_per_s."""

    bandwidth_bytes_per_s: float = Field(gt=0)
    latency_s: float = Field(ge=0)


class LinkMatrix(FrozenModel):
    """Links among ``size`` endpoints: one uniform link, or explicit [src][dst] matrices."""

    size: int = Field(ge=1)
    uniform: LinkProfile | None = None
    bandwidth_bytes_per_s: tuple[tuple[float, ...], ...] | None = None
    latency_s: tuple[tuple[float, ...], ...] | None = None
    bandwidth_spread: tuple[tuple[float, ...], ...] | None = Field(
        default=None, description="Measured links: interquartile range / median of each bandwidth."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        explicit = self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        if (self.uniform is None) == (not explicit):
            raise SchemaError("a link matrix needs either 'uniform' or both 'bandwidth_bytes_per_s' and 'latency_s'")
        if explicit:
            assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
            for label, rows in (
                ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s),
                ("latency_s", self.latency_s),
            ):
                if len(rows) != self.size or any(len(r) != self.size for r in rows):
                    raise SchemaError(f"link matrix {label} must be {self.size} x {self.size}")
            for i, row in enumerate(self.bandwidth_bytes_per_s):
                for j, bw in enumerate(row):
                    if i != j and bw <= 0:
                        raise SchemaError(f"link {i}->{j} has bandwidth {bw}; it must be > 0")
        return self

    def link(self, src: int, dst: int) -> LinkProfile:
        """The link from endpoint ``src`` to ``dst``."""
        if self.uniform is not None:
            return self.uniform
        assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        return LinkProfile(
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s[src][dst], latency_s=self.latency_s[src][dst]
        )


class CollectiveRecord(FrozenModel):
    """One measured (or published) collective: ``op`` over a group of ``group_size`` ranks took ``time_s``."""

    op: CollectiveOp
    placement: Placement
    group_size: int = Field(ge=2)
    members_per_node: int = Field(ge=1, description="Group members that share a node.")
    message_bytes: int = Field(ge=1, description="Bytes of the full buffer (nccl-tests 'size').")
    time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")


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


class ClusterProfile(FrozenModel):
    """A homogeneous cluster of ``num_nodes`` x ``devices_per_node`` ranks."""

    schema_version: Literal[3] = 3
    name: str
    num_nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    device: DeviceProfile
    intra_node_links: LinkMatrix = Field(description="Device-to-device links inside every node.")
    inter_node_links: LinkMatrix = Field(
        description="Node-to-node links, per device's own network interface (one rail)."
    )
    collectives: tuple[CollectiveRecord, ...] = Field(default=(), description="Measured collective curves.")
    provenance: Provenance
    calibration: Calibration | None = Field(
        default=None, description="Correction factors fitted from measured runs (planner tune); None: uncalibrated."
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> Self:
        if self.intra_node_links.size != self.devices_per_node:
            raise SchemaError(
                f"intra_node_links.size={self.intra_node_links.size} must equal "
                f"devices_per_node={self.devices_per_node}"
            )
        if self.inter_node_links.size != self.num_nodes:
            raise SchemaError(
                f"inter_node_links.size={self.inter_node_links.size} must equal num_nodes={self.num_nodes}"
            )
        return self

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.num_nodes * self.devices_per_node


CLUSTER_SCHEMA_VERSION = 3
"""The version this planner writes."""
READABLE_VERSIONS = (1, 2, 3)
"""The versions ``upgrade`` reads."""


def upgrade(raw: Mapping[str, object]) -> dict[str, object]:
    """A cluster profile's JSON object of any readable version as the current version's.

    Version 1 -> 2: the device's kind, derived once from its name (``device_kind_of_v1_name``),
    and each op record's positional shape as named fields (``op_records.record_from_v1``).
    Version 2 -> 3: nothing to change; a version-2 profile holds no ``moe_layer`` record.

    Raises:
        SchemaError: a version-1 device or op record that cannot be read, naming it.
    """
    version = raw.get("schema_version", 1)
    if version == 2:
        return {**raw, "schema_version": 3}
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
