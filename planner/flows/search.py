"""`planner search`: the fastest layouts that fit, as plans, and the search's account."""

from collections.abc import Sequence

from planner.files.plans import make_plan
from planner.flows.loading import cluster_of, model_for, routing_of
from planner.schemas import Alternative, ClusterProfile, ModelSpec, Plan, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.settings import SearchSettings
from planner.search_engine import make_strategy
from planner.search_engine.expert_placement import ExpertPlacementRefiner
from planner.search_engine.refiner import Refiner
from planner.search_engine.runner import DEFAULT_REFINERS, SearchOutcome, run_search
from planner.search_engine.strategy import Progress, SearchStrategy


def search_outcome(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    settings: SearchSettings = SearchSettings(),
    *,
    strategy: SearchStrategy | None = None,
    progress: Progress | None = None,
    refiners: Sequence[Refiner] = DEFAULT_REFINERS,
) -> tuple[SearchOutcome, tuple[Plan, ...]]:
    """Search layouts; the search's account (space size, evaluations, time) and the ranked plans.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` or a profile path; a cluster given as a
            string is recorded in the plans.
        training: global batch (sequences), sequence length (tokens), precision.
        settings: what to search for and how hard (``SearchSettings``).
        strategy: a strategy object to search with instead of ``settings.strategy``'s.
        progress: called as progress(done, total) while searching.
        refiners: applied in order to the strategy's finalists (default ``DEFAULT_REFINERS``: the
            CP-SAT layer split, then the rank-to-device map's node order and each node's local
            order); with a routing trace, the CP-SAT expert placement after them.

    Returns:
        The search's outcome, and its top-k plans fastest first, each naming its runner-up.

    Raises:
        SchemaError: an input could not be read or is invalid, or the sequence is longer than the
            model allows (``ModelSpec.max_seq_len``).
        InfeasibleConfigError: no layout fits; the message says how close one came and what would help.
    """
    if settings.expert_replicas < 0:
        raise SchemaError(
            f"--expert-replicas {settings.expert_replicas} must be 0 or more: spare expert slots per rank"
        )
    if settings.expert_replicas and settings.routing_trace is None:
        raise SchemaError(
            f"--expert-replicas {settings.expert_replicas} needs a routing trace (--routing-trace): it shows which "
            "experts are hot enough to replicate"
        )
    model_spec = model_for(model, training)
    cluster_spec = cluster if isinstance(cluster, str) else cluster.name
    cluster_profile = cluster_of(cluster)
    chosen = strategy or make_strategy(settings.strategy, storage=settings.storage)
    routing = routing_of(settings.routing_trace, model_spec)
    if routing is not None:
        refiners = (*refiners, ExpertPlacementRefiner(stats=routing, replicas=settings.expert_replicas))
    outcome = run_search(
        model_spec, training, cluster_profile, chosen, settings, progress=progress, refiners=refiners, routing=routing
    )
    ranked = outcome.ranked
    plans = tuple(
        make_plan(
            model_spec,
            training,
            cluster_profile,
            cluster_spec,
            c.layout,
            c.estimate,
            runner_up=Alternative(layout=ranked[i + 1].layout, estimate=ranked[i + 1].estimate)
            if i + 1 < len(ranked)
            else None,
        )
        for i, c in enumerate(ranked)
    )
    return outcome, plans


def search(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    settings: SearchSettings = SearchSettings(),
    *,
    strategy: SearchStrategy | None = None,
    progress: Progress | None = None,
    refiners: Sequence[Refiner] = DEFAULT_REFINERS,
) -> tuple[Plan, ...]:
    """The fastest layouts that fit, as plans: :func:`search_outcome` without the search's account.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` (``dgx-h100:4``) or a profile path; a
            cluster given as a string is recorded in the plans.
        training: global batch (sequences), sequence length (tokens), precision.
        settings: what to search for and how hard (``SearchSettings``: strategy, budget, top_k,
            seed, memory margin, ...).
        strategy: a strategy object to search with instead of ``settings.strategy``'s.
        progress: called as progress(done, total) while searching (total None where unknown).
        refiners: applied in order to the strategy's finalists (default: the CP-SAT layer split,
            then the rank-to-device map's node order and each node's local order).

    Returns:
        Up to ``settings.top_k`` plans, fastest first, each naming its runner-up.

    Raises:
        SchemaError: an input could not be read or is invalid, or the sequence is longer than the
            model allows (``ModelSpec.max_seq_len``).
        InfeasibleConfigError: no layout fits; the message says how close one came and what would help.
    """
    _, plans = search_outcome(
        model, cluster, training, settings, strategy=strategy, progress=progress, refiners=refiners
    )
    return plans
