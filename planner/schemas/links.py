"""Links: a point-to-point link, and the links among the endpoints of one level (the devices of
a node, or the nodes of a cluster).

A matrix is stored in the most compact form that holds what was measured or published, so that
10,000+ devices stay small (design.md): one uniform link; one link per endpoint (its network
interface), a pair running at the slower of its two ends; or explicit [src][dst] matrices.

A link's figures are one-way: what a transfer gets while the other direction is idle. A measured
matrix may also hold each pair's duplex bandwidth, what each direction gets while both ends send
at once (``LinkMatrix.duplex_bandwidth_bytes_per_s``): a two-member ring sends both ways at once,
and a link whose two directions share something gets less than its one-way figure (the
namespaced test hosts, ``benchmarks/netns_profile.py``: half of it each way, on the
rate-shaped pair and on the unshaped pairs, whose copies share the machine's cores). Without it
a link is taken as full duplex, as NVLink, InfiniBand and Ethernet are specified.

``LinkMatrix.link`` reads one pair; ``LinkMatrix.arrays`` holds every pair's bandwidth and
latency as numpy arrays that agree with it, built once per matrix, for code that scans whole rows
(the device-mapping refiner walks thousands of nodes).
"""

import itertools
from dataclasses import dataclass
from typing import Self

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.errors import SchemaError


class LinkProfile(FrozenModel):
    """A point-to-point link: time(bytes) = latency_s + bytes / bandwidth_bytes_per_s."""

    bandwidth_bytes_per_s: float = Field(gt=0)
    latency_s: float = Field(ge=0)


def slower_link(a: LinkProfile, b: LinkProfile) -> LinkProfile:
    """The lower bandwidth and the higher latency of ``a`` and ``b`` (``a`` itself when it is both)."""
    if a.bandwidth_bytes_per_s <= b.bandwidth_bytes_per_s and a.latency_s >= b.latency_s:
        return a
    return LinkProfile(
        bandwidth_bytes_per_s=min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s),
        latency_s=max(a.latency_s, b.latency_s),
    )


FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LinkArrays:
    """Every [src][dst] link of a matrix as two read-only ``size`` x ``size`` arrays. Each entry is
    what ``LinkMatrix.link(src, dst)`` returns; the diagonal of an explicit matrix holds what was
    stored there (a device's link to itself is no link, and ``link`` refuses a zero bandwidth)."""

    bandwidth_bytes_per_s: FloatArray
    latency_s: FloatArray


class LinkMatrix(FrozenModel):
    """Links among ``size`` endpoints: exactly one of a uniform link, one link per endpoint, or
    explicit [src][dst] matrices."""

    # Its arrays (``arrays``) are built once and kept in a slot of their own, as the base keeps its
    # hash: not a field, so equality, serialization and copies (``model_copy`` copies fields, and an
    # updated copy builds its own) do not see them. (A comment, not the docstring: the docstring is
    # part of the cluster profile's frozen JSON schema.)

    __slots__ = ("_arrays",)

    size: int = Field(ge=1)
    uniform: LinkProfile | None = None
    endpoints: tuple[LinkProfile, ...] | None = Field(
        default=None,
        description="Each endpoint's own link (its network interface); a pair runs at the slower of its two "
        "ends (the lower bandwidth, the higher latency), as on a non-blocking fabric whose transfers are "
        "bounded by the interfaces at their ends.",
    )
    bandwidth_bytes_per_s: tuple[tuple[float, ...], ...] | None = None
    latency_s: tuple[tuple[float, ...], ...] | None = None
    bandwidth_spread: tuple[tuple[float, ...], ...] | None = Field(
        default=None, description="Measured links: interquartile range / median of each bandwidth."
    )
    duplex_bandwidth_bytes_per_s: tuple[tuple[float, ...], ...] | None = Field(
        default=None,
        description="Measured links: each direction's bandwidth while both ends of the pair send at once "
        "(symmetric; the diagonal unused). A two-member ring runs at the lower of it and its one-way "
        "figures. None: full duplex, each direction at its one-way figure.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        explicit = self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        forms = (self.uniform is not None) + (self.endpoints is not None) + explicit
        if forms != 1:
            raise SchemaError(
                "a link matrix needs exactly one of 'uniform', 'endpoints' (one link per endpoint) or both "
                "'bandwidth_bytes_per_s' and 'latency_s'"
            )
        if self.endpoints is not None and len(self.endpoints) != self.size:
            raise SchemaError(
                f"link matrix endpoints lists {len(self.endpoints)} links; give one per endpoint, {self.size}"
            )
        if self.duplex_bandwidth_bytes_per_s is not None and not explicit:
            raise SchemaError(
                "a link matrix's 'duplex_bandwidth_bytes_per_s' goes with explicit 'bandwidth_bytes_per_s' and "
                "'latency_s' matrices; remove it from a uniform or per-endpoint matrix (taken as full duplex)"
            )
        if explicit:
            assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
            for label, rows in (
                ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s),
                ("latency_s", self.latency_s),
                ("duplex_bandwidth_bytes_per_s", self.duplex_bandwidth_bytes_per_s or ()),
            ):
                if rows and (len(rows) != self.size or any(len(r) != self.size for r in rows)):
                    raise SchemaError(f"link matrix {label} must be {self.size} x {self.size}")
            bandwidth, latency = self.arrays().bandwidth_bytes_per_s, self.arrays().latency_s
            bad = np.argwhere((bandwidth <= 0) & ~np.eye(self.size, dtype=bool))
            if len(bad):
                i, j = (int(k) for k in bad[0])
                raise SchemaError(f"link {i}->{j} has bandwidth {bandwidth[i, j]}; it must be > 0")
            bad = np.argwhere(latency < 0)
            if len(bad):
                i, j = (int(k) for k in bad[0])
                raise SchemaError(f"link {i}->{j} has latency {latency[i, j]}; it must be >= 0 (seconds)")
            if self.duplex_bandwidth_bytes_per_s is not None:
                duplex = _square(self.duplex_bandwidth_bytes_per_s, self.size)
                bad = np.argwhere(~(duplex > 0) & ~np.eye(self.size, dtype=bool))
                if len(bad):
                    i, j = (int(k) for k in bad[0])
                    raise SchemaError(f"link {i}<->{j} has duplex bandwidth {duplex[i, j]}; it must be > 0")
        return self

    def arrays(self) -> LinkArrays:
        """Every pair's bandwidth and latency (``LinkArrays``), built on the first call: a uniform
        link fills both, one link per endpoint pairs the slower ends (outer min and max), explicit
        matrices are read row by row."""
        kept: LinkArrays | None = getattr(self, "_arrays", None)
        if kept is None:
            kept = self._build_arrays()
            object.__setattr__(self, "_arrays", kept)
        return kept

    def _build_arrays(self) -> LinkArrays:
        n = self.size
        if self.uniform is not None:
            bandwidth = np.full((n, n), self.uniform.bandwidth_bytes_per_s)
            latency = np.full((n, n), self.uniform.latency_s)
        elif self.endpoints is not None:
            end_bandwidth = np.array([lk.bandwidth_bytes_per_s for lk in self.endpoints])
            end_latency = np.array([lk.latency_s for lk in self.endpoints])
            bandwidth = np.minimum.outer(end_bandwidth, end_bandwidth)
            latency = np.maximum.outer(end_latency, end_latency)
        else:
            assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
            bandwidth = _square(self.bandwidth_bytes_per_s, n)
            latency = _square(self.latency_s, n)
        bandwidth.flags.writeable = False
        latency.flags.writeable = False
        return LinkArrays(bandwidth, latency)

    def link(self, src: int, dst: int) -> LinkProfile:
        """The link from endpoint ``src`` to ``dst``."""
        if self.uniform is not None:
            return self.uniform
        if self.endpoints is not None:
            return slower_link(self.endpoints[src], self.endpoints[dst])
        assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        return LinkProfile(
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s[src][dst], latency_s=self.latency_s[src][dst]
        )

    def ring_slowest(self, endpoints: tuple[int, ...] | range) -> LinkProfile:
        """The slowest bandwidth and latency among the links of a ring through ``endpoints`` (in
        order, the last back to the first; >= 2 endpoints). A ring of two sends both ways over one
        pair at once: its bandwidth is also bounded by the pair's duplex figure, where measured."""
        if self.uniform is not None:
            return self.uniform
        if self.endpoints is not None:
            ends = [self.endpoints[e] for e in endpoints]
            return LinkProfile(
                bandwidth_bytes_per_s=min(lk.bandwidth_bytes_per_s for lk in ends),
                latency_s=max(lk.latency_s for lk in ends),
            )
        assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        if len(endpoints) <= SMALL_RING:  # a node's ring: a few look-ups, faster than numpy's set-up
            ring = tuple(endpoints)
            pairs = list(zip(ring, ring[1:] + ring[:1], strict=True))
            bandwidth = min(self.bandwidth_bytes_per_s[a][b] for a, b in pairs)
            latency = max(self.latency_s[a][b] for a, b in pairs)
        else:
            order = np.fromiter(endpoints, dtype=np.intp)
            arrays, following = self.arrays(), np.roll(order, -1)
            bandwidth = float(arrays.bandwidth_bytes_per_s[order, following].min())
            latency = float(arrays.latency_s[order, following].max())
        if len(endpoints) == 2 and self.duplex_bandwidth_bytes_per_s is not None:
            a, b = endpoints
            bandwidth = min(bandwidth, self.duplex_bandwidth_bytes_per_s[a][b])
        # read from a validated matrix: nothing to check again
        return LinkProfile.model_construct(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


SMALL_RING = 16
"""Rings of up to this many endpoints are read entry by entry (``LinkMatrix.ring_slowest``)."""


def _square(rows: tuple[tuple[float, ...], ...], n: int) -> FloatArray:
    """An n x n float array of rows already checked to be n long each (flattened in one pass, not
    through a list of lists)."""
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float64, count=n * n).reshape(n, n)
