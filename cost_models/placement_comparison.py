"""A layout's expert placement beside round-robin on a routing trace: what
``planner explain --routing-trace`` shows.

Every expert-parallel group of a layout runs the same placement (``ExpertPlacement.slots``,
by a rank's place in its group) on its own share of the tokens, and the trace stands for each
group's tokens. The hottest rank's load and the cross-rank tokens are then the same in every
group; the cross-node tokens depend on the nodes the group's ranks run on (the devices of
``cost_models.groups.expert_groups``, after the layout's device map), so the group that sends the
most across nodes is reported: the groups exchange tokens at once and the slowest sets the pace.
"""

from dataclasses import dataclass

from cost_models.groups import expert_groups
from planner.schemas import ExpertPlacement, Layout, ModelSpec, PlacementMetrics, RoutingStats
from planner.schemas.device_map import node_numbers
from planner.schemas.routing import placement_metrics


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementComparison:
    """Routing cost of a layout's placement and of round-robin on one trace (``placement_metrics``)."""

    placed: PlacementMetrics
    """The layout's placement (contiguous blocks when it has none)."""
    round_robin: PlacementMetrics
    """Expert e on rank e mod ep, as a baseline."""
    contiguous: bool
    """Whether the layout has no placement of its own: expert e on rank e // (E / ep)."""
    expert_parallel_degree: int
    """Ranks per expert-parallel group (ep)."""
    groups: int
    """Expert-parallel groups in the layout."""
    nodes_per_group: int
    """Most nodes one group's ranks run on."""
    routed_tokens: int
    """Tokens in the trace."""


def placement_applies(model: ModelSpec, layout: Layout) -> bool:
    """Whether the layout places experts on several ranks: a mixture of experts with ep > 1."""
    return model.is_moe and layout.expert_parallel_degree > 1


def expert_group_nodes(layout: Layout, devices_per_node: int) -> tuple[tuple[int, ...], ...]:
    """For every expert-parallel group, the node of each of its ranks (by place in the group),
    nodes numbered from 0 in the order the group meets them."""
    return tuple(node_numbers(group.devices, devices_per_node) for group in expert_groups(layout))


def compare_placements(
    stats: RoutingStats, model: ModelSpec, layout: Layout, devices_per_node: int
) -> PlacementComparison | None:
    """The layout's placement and round-robin on ``stats``; None when it places no experts
    (``placement_applies``).

    Raises:
        SchemaError: the trace is not of the model's MoE layers and experts.
    """
    if not placement_applies(model, layout):
        return None
    stats.check_model(model)
    ep, experts, layers = layout.expert_parallel_degree, model.num_local_experts, stats.num_layers
    ours = layout.expert_placement or ExpertPlacement.contiguous(experts, ep, layers)
    every_group = expert_group_nodes(layout, devices_per_node)
    patterns = set(every_group)

    def busiest(placement: ExpertPlacement) -> PlacementMetrics:
        """The metrics of the group that sends the most tokens across nodes."""
        return max(
            (placement_metrics(stats, placement, nodes) for nodes in sorted(patterns)),
            key=lambda m: m.cross_node_tokens,
        )

    return PlacementComparison(
        placed=busiest(ours),
        round_robin=busiest(ExpertPlacement.round_robin(experts, ep, layers)),
        contiguous=layout.expert_placement is None,
        expert_parallel_degree=ep,
        groups=len(every_group),
        nodes_per_group=max(max(nodes) + 1 for nodes in patterns),
        routed_tokens=stats.routed_tokens,
    )
