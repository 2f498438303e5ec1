"""Mixed clusters from presets: ``dgx-a100-80g:4+dgx-h100:4`` is four A100 nodes then four H100 nodes.

The first part's nodes describe the cluster's defaults; each later part whose devices, links,
network interface or intra-node collective curves differ becomes a node override
(``ClusterProfile.node_overrides``), so the combined profile is as compact as its parts. Nodes
keep their part's order (nodes 0-3 A100, 4-7 H100 above), as a rank order numbers them.

Links across nodes: each node keeps its part's per-rail link, and a pair of nodes runs at the
slower of its two ends (``LinkMatrix.endpoints``; a non-blocking fabric, where a transfer is
bounded by the interfaces at its ends). Collective curves measured across nodes are kept only
when every part has the same; otherwise such phases are priced from the node matrix.
"""

from collections.abc import Sequence

from planner.schemas import (
    ClusterProfile,
    CollectiveRecord,
    HostProfile,
    LinkMatrix,
    LinkProfile,
    NodeOverride,
    Placement,
    Provenance,
)
from planner.schemas.errors import SchemaError

MIX_SEPARATOR = "+"
"""Joins the parts of a mixed cluster spec."""


def _intra_records(cluster: ClusterProfile) -> tuple[CollectiveRecord, ...]:
    return tuple(r for r in cluster.collectives if r.placement is Placement.INTRA_NODE)


def _inter_records(cluster: ClusterProfile) -> tuple[CollectiveRecord, ...]:
    return tuple(r for r in cluster.collectives if r.placement is Placement.INTER_NODE)


def _rail(part: ClusterProfile, spec: str) -> LinkProfile:
    """A part's one per-rail link across nodes (presets have one)."""
    if part.inter_node_links.uniform is None or part.node_overrides:
        raise SchemaError(
            f"cluster {spec!r}: part {part.name!r} does not describe every node alike; a mixed cluster combines "
            "presets (NAME:NODES); describe any other in a cluster file with node_overrides"
        )
    return part.inter_node_links.uniform


def _common_host(parts: Sequence[ClusterProfile]) -> HostProfile | None:
    """The host every node is priced with: the parts' one host, or where they differ the least
    memory and the slowest CPU Adam of them (an offload fits and runs on every node); None where
    a part does not describe its hosts."""
    hosts = [part.host for part in parts]
    if any(host is None for host in hosts):
        return None
    return HostProfile(
        memory_bytes=min(h.memory_bytes for h in hosts if h is not None),
        adam_params_per_s=min(h.adam_params_per_s for h in hosts if h is not None),
    )


def mix_clusters(parts: Sequence[ClusterProfile], *, spec: str) -> ClusterProfile:
    """One cluster of ``parts``' nodes in order (module docstring).

    Args:
        parts: clusters described alike on every node (presets), with the same devices per node.
        spec: the mixed cluster's spec (``dgx-a100-80g:4+dgx-h100:4``), its name and what messages quote.

    Returns:
        The combined ClusterProfile; a single part is returned as it is.

    Raises:
        SchemaError: parts with different devices per node, or a part that is not described alike
            on every node.
    """
    first = parts[0]
    rails = [_rail(part, spec) for part in parts]
    if len(parts) == 1:
        return first
    per_node = {part.name: part.devices_per_node for part in parts}
    if len(set(per_node.values())) > 1:
        counts = ", ".join(f"{name} {n}" for name, n in per_node.items())
        raise SchemaError(
            f"cluster {spec!r} mixes nodes of different sizes ({counts} devices per node); every node of a "
            "cluster needs the same number of devices: mix presets of one node size"
        )
    overrides: list[NodeOverride] = []
    endpoints: list[LinkProfile] = []
    offset = 0
    for part, rail in zip(parts, rails, strict=True):
        nodes = tuple(range(offset, offset + part.num_nodes))
        offset += part.num_nodes
        endpoints.extend([rail] * part.num_nodes)
        differs = {
            "device": part.device if part.device != first.device else None,
            "intra_node_links": part.intra_node_links if part.intra_node_links != first.intra_node_links else None,
            "nic": part.nic if part.nic != first.nic else None,
            "collectives": _intra_records(part) if _intra_records(part) != _intra_records(first) else None,
        }
        if any(value is not None for value in differs.values()):
            overrides.append(NodeOverride.model_validate({"nodes": nodes, **differs}))
    inter_records = _inter_records(first) if all(_inter_records(p) == _inter_records(first) for p in parts) else ()
    uniform = all(rail == rails[0] for rail in rails)
    return ClusterProfile(
        name=spec,
        num_nodes=offset,
        devices_per_node=first.devices_per_node,
        device=first.device,
        intra_node_links=first.intra_node_links,
        nic=first.nic,
        inter_node_links=LinkMatrix(size=offset, uniform=rails[0])
        if uniform
        else LinkMatrix(size=offset, endpoints=tuple(endpoints)),
        node_overrides=tuple(overrides),
        collectives=_intra_records(first) + inter_records,
        host=_common_host(parts),
        provenance=Provenance(
            kind="preset",
            created=max(part.provenance.created for part in parts),
            sources=tuple(dict.fromkeys(source for part in parts for source in part.provenance.sources)),
        ),
    )
