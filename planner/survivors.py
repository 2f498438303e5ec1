"""The devices left of a cluster when a job restarts with fewer ranks (issue 18): the cluster's
profile cut to the first ranks of the new world, as an elastic restart or a re-plan after a
failure prices them.

A cluster of several nodes loses whole nodes (torchrun's elastic agents join and leave a node at
a time): the first ``world_size / devices_per_node`` nodes stay. A single node keeps its first
``world_size`` devices. Either way the kept part's links, node overrides and collective curves
are the measured ones; curves of groups larger than the new world are dropped, since no group
of the new world has that size.
"""

from planner.schemas import ClusterProfile
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.links import LinkMatrix


def first_endpoints(links: LinkMatrix, size: int) -> LinkMatrix:
    """The links among the first ``size`` endpoints of ``links`` (1 <= size <= links.size)."""
    if links.endpoints is not None:
        return links.model_copy(update={"size": size, "endpoints": links.endpoints[:size]})
    if links.uniform is not None:
        return links.model_copy(update={"size": size})

    def cut(rows: tuple[tuple[float, ...], ...] | None) -> tuple[tuple[float, ...], ...] | None:
        return None if rows is None else tuple(row[:size] for row in rows[:size])

    return LinkMatrix(
        size=size,
        bandwidth_bytes_per_s=cut(links.bandwidth_bytes_per_s),
        latency_s=cut(links.latency_s),
        bandwidth_spread=cut(links.bandwidth_spread),
    )


def survivors(cluster: ClusterProfile, world_size: int) -> ClusterProfile:
    """``cluster`` cut to its first ``world_size`` ranks: whole nodes when it has several, the
    first devices of its node otherwise (see the module's docstring).

    Raises:
        InfeasibleConfigError: ``world_size`` is not 1..the cluster's world size, or (several
            nodes) not a whole number of nodes.
    """
    per_node = cluster.devices_per_node
    if not 1 <= world_size <= cluster.world_size:
        raise InfeasibleConfigError(
            f"{world_size} ranks do not fit in cluster {cluster.name!r} of {cluster.world_size}; "
            f"run 1 to {cluster.world_size} ranks, or plan for a larger cluster"
        )
    if world_size == cluster.world_size:
        return cluster
    name = f"{cluster.name}-first-{world_size}"
    kept = tuple(c for c in cluster.collectives if c.group_size <= world_size)
    if cluster.num_nodes == 1:
        return ClusterProfile.model_validate(
            {
                **dict(cluster),
                "name": name,
                "devices_per_node": world_size,
                "intra_node_links": first_endpoints(cluster.intra_node_links, world_size),
                "collectives": kept,
            }
        )
    if world_size % per_node:
        raise InfeasibleConfigError(
            f"{world_size} ranks are not whole nodes of cluster {cluster.name!r} ({per_node} devices each); "
            f"run a multiple of {per_node} ranks"
        )
    nodes = world_size // per_node
    overrides = []
    for override in cluster.node_overrides:
        left = tuple(n for n in override.nodes if n < nodes)
        if left:
            overrides.append(override.model_copy(update={"nodes": left}))
    return ClusterProfile.model_validate(
        {
            **dict(cluster),
            "name": name,
            "num_nodes": nodes,
            "inter_node_links": first_endpoints(cluster.inter_node_links, nodes),
            "node_overrides": tuple(overrides),
            "collectives": kept,
        }
    )
