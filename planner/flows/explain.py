"""`planner explain`: what a plan holds beyond its estimate (its expert placement beside
round-robin, its step replayed stage by stage, its expert traffic)."""

from dataclasses import dataclass, replace
from pathlib import Path

from cost_models.expert_parallel import sent_bytes_per_step
from cost_models.placement_comparison import PlacementComparison
from cost_models.placement_comparison import compare_placements as _compare_placements
from cost_models.schedule_timeline import Timeline, estimate_timeline
from planner.files.clusters import load_cluster
from planner.files.plans import load_plan, plan_cluster
from planner.files.routing_trace import load_routing_stats
from planner.flows.estimate import estimate, homogeneous_estimate, stage_device_names
from planner.flows.loading import routing_of
from planner.schemas import ClusterProfile, Estimate, Layout, Plan, Schedule, VocabularyLayout
from planner.schemas.device_map import IDENTITY
from planner.schemas.geometry import num_micro_batches


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedDevices:
    """How a plan on a cluster of mixed devices is priced, beside the homogeneous treatment."""

    stage_devices: tuple[str, ...]
    """The device type pricing each pipeline stage."""
    homogeneous: Estimate
    """The plan priced with every rank as the slowest device with the smallest memory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """What `planner explain` shows of a plan beside its own estimate: each a comparison that
    applies to it, or None."""

    plan: Plan
    cluster: ClusterProfile
    """The plan's cluster profile, as loaded from its spec."""
    mixed_devices: MixedDevices | None
    """On a cluster of mixed devices: the stage-by-stage pricing beside the homogeneous one."""
    identity_mapping: Estimate | None
    """With a device map: the layout on the identity map, against which the mapping gains."""
    other_vocabulary: tuple[Layout, Estimate] | None
    """With a 1F1B pipeline: the layout with its vocabulary layers the other way, and its estimate."""
    placement: PlacementComparison | None
    """With a routing trace: the plan's expert placement beside round-robin (None where the plan
    places no experts)."""
    timeline: Timeline | None
    """When asked: the plan's step replayed stage by stage."""


def explain(
    plan: Plan | str | Path,
    *,
    routing_trace: Path | str | None = None,
    timeline: bool = False,
    cluster: str | None = None,
) -> Explanation:
    """What a plan holds beyond its estimate: the comparisons that apply to it.

    Args:
        plan: a Plan or a plan file.
        routing_trace: a routing trace of the plan's model: its expert placement is compared with
            round-robin on it.
        timeline: also replay the plan's step stage by stage (for the plots).
        cluster: the plan's cluster profile where it is not at the path the plan names (a preset or a file).

    Returns:
        The plan, its cluster and each comparison that applies (``Explanation``).

    Raises:
        SchemaError: the plan, its cluster or the trace cannot be read, the cluster is another than the
            plan's (``planner.files.plans.plan_cluster``), or the trace is of another model.
    """
    loaded = _plan(plan)
    profile = plan_cluster(loaded, cluster)
    assert profile is not None  # required: a missing profile raises
    model, training, layout = loaded.model, loaded.training, loaded.layout
    mixed = None
    if profile.has_mixed_devices:
        homogeneous = homogeneous_estimate(model, profile, training, layout)
        mixed = MixedDevices(stage_devices=stage_device_names(profile, layout), homogeneous=homogeneous)
    identity = None
    if not layout.device_map.is_identity:
        identity = estimate(model, profile, training, replace(layout, device_map=IDENTITY))
    other = _other_vocabulary(layout)
    return Explanation(
        plan=loaded,
        cluster=profile,
        mixed_devices=mixed,
        identity_mapping=identity,
        other_vocabulary=(other, estimate(model, profile, training, other)) if other is not None else None,
        placement=compare_placements(loaded, routing_trace) if routing_trace is not None else None,
        timeline=pipeline_timeline(loaded, profile) if timeline else None,
    )


def _other_vocabulary(layout: Layout) -> Layout | None:
    """The layout with its vocabulary layers the other way (pinned against split over the
    pipeline), where a pipeline allows both; None otherwise."""
    if layout.pipeline_parallel_degree < 2 or layout.schedule is not Schedule.ONE_F_ONE_B:
        return None
    pinned = VocabularyLayout.PINNED
    other = VocabularyLayout.VOCAB_2 if layout.vocabulary_layout is pinned else pinned
    return replace(layout, vocabulary_layout=other)


def _plan(plan: Plan | str | Path) -> Plan:
    return plan if isinstance(plan, Plan) else load_plan(plan)


def compare_placements(plan: Plan | str | Path, routing_trace: Path | str) -> PlacementComparison | None:
    """A plan's expert placement beside round-robin on a routing trace: the hottest rank's and the
    mean rank's routed tokens, and the tokens that cross ranks and nodes between MoE layers.

    Args:
        plan: a Plan or a plan file; without a placement its experts sit in contiguous blocks.
        routing_trace: a routing trace file (``planner.files.routing_trace``) of the plan's model.

    Returns:
        Both placements' figures, cross-node tokens for the expert-parallel group that sends the
        most (``cost_models.placement_comparison``); None when the plan places no experts (a dense
        model, or ep = 1).

    Raises:
        SchemaError: the plan or the trace cannot be read, or the trace is of another model.
    """
    loaded = _plan(plan)
    stats = load_routing_stats(routing_trace, loaded.model)
    return _compare_placements(stats, loaded.model, loaded.layout, loaded.cluster.devices_per_node)


def pipeline_timeline(plan: Plan | str | Path, cluster: ClusterProfile | None = None) -> Timeline:
    """A plan's step replayed stage by stage: each micro-batch's forward, recompute, backward
    and communication, from the estimate's own per-stage times (``cost_models.schedule_timeline``).

    Args:
        plan: a Plan or a plan file.
        cluster: the plan's cluster profile, when already loaded (default: loaded from the plan).

    Returns:
        The timeline; an MoE model's routing is taken as uniform.

    Raises:
        SchemaError: the plan or its cluster cannot be read.
    """
    loaded = _plan(plan)
    profile = cluster if cluster is not None else load_cluster(loaded.cluster.spec)
    return estimate_timeline(loaded.model, loaded.training, profile, loaded.layout)


def expert_traffic(plan: Plan | str | Path, routing_trace: str | Path | None = None) -> tuple[float, ...]:
    """What one rank of each pipeline stage is predicted to send to other expert-parallel ranks
    in one step (``cost_models.expert_parallel.sent_bytes_per_step``), as a RunReport's
    ``expert_sent_bytes_per_step`` measures it.

    Args:
        plan: a plan (or its file) of an MoE model; all zeros without expert parallelism.
        routing_trace: a routing trace of the model (e.g. the one ``run`` captured); None
            assumes uniform routing.

    Returns:
        Bytes per step, one entry per pipeline stage, in stage order.

    Raises:
        SchemaError: the plan or the trace cannot be read, or the trace is of another model.
    """
    loaded = _plan(plan)
    routing = routing_of(routing_trace, loaded.model)
    m = num_micro_batches(loaded.training.global_batch_size, loaded.layout)
    return sent_bytes_per_step(loaded.model, loaded.training, loaded.layout, m, routing)
