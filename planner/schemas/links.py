"""Links: a point-to-point link, and the links among the endpoints of one level (the devices of
a node, or the nodes of a cluster).

A matrix is stored in the most compact form that holds what was measured or published, so that
10,000+ devices stay small (design.md): one uniform link; one link per endpoint (its network
interface), a pair running at the slower of its two ends; or explicit [src][dst] matrices.
"""

from typing import Self

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


class LinkMatrix(FrozenModel):
    """Links among ``size`` endpoints: exactly one of a uniform link, one link per endpoint, or
    explicit [src][dst] matrices."""

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
        if self.endpoints is not None:
            return slower_link(self.endpoints[src], self.endpoints[dst])
        assert self.bandwidth_bytes_per_s is not None and self.latency_s is not None
        return LinkProfile(
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s[src][dst], latency_s=self.latency_s[src][dst]
        )

    def ring_slowest(self, endpoints: tuple[int, ...] | range) -> LinkProfile:
        """The slowest bandwidth and latency among the links of a ring through ``endpoints`` (in
        order, the last back to the first; >= 2 endpoints)."""
        if self.uniform is not None:
            return self.uniform
        if self.endpoints is not None:
            ends = [self.endpoints[e] for e in endpoints]
            return LinkProfile(
                bandwidth_bytes_per_s=min(lk.bandwidth_bytes_per_s for lk in ends),
                latency_s=max(lk.latency_s for lk in ends),
            )
        order = tuple(endpoints)
        links = [self.link(a, b) for a, b in zip(order, order[1:] + order[:1], strict=True)]
        return LinkProfile(
            bandwidth_bytes_per_s=min(lk.bandwidth_bytes_per_s for lk in links),
            latency_s=max(lk.latency_s for lk in links),
        )
