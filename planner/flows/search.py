"""`planner search`: the fastest layouts that fit, as plans, and the search's account."""

from collections.abc import Callable, Sequence

from planner.export.targets import STACK_CHECKS
from planner.files.plans import make_plan
from planner.flows.loading import cluster_of, model_for, routing_of
from planner.schemas import Alternative, ClusterProfile, DeviceKind, Layout, ModelSpec, Plan, StackName, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_buildable, check_runnable
from planner.schemas.settings import SearchSettings
from planner.schemas.stacks import stack_named
from planner.search_engine import make_strategy
from planner.search_engine.expert_placement import ExpertPlacementRefiner
from planner.search_engine.refiner import Refiner
from planner.search_engine.runner import DEFAULT_REFINERS, SearchOutcome, run_search
from planner.search_engine.strategy import Candidate, Progress, SearchStrategy


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
        check_replica_slots(settings.expert_replicas, model_spec, cluster_profile.world_size)
        refiners = (*refiners, ExpertPlacementRefiner(stats=routing, replicas=settings.expert_replicas))
    admit = admission(model_spec, training, cluster_profile)
    outcome = run_search(
        model_spec,
        training,
        cluster_profile,
        chosen,
        settings,
        progress=progress,
        refiners=refiners,
        routing=routing,
        admit=admit,
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


def search_recipes(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    recipes: Sequence[Fp8Recipe | None],
    settings: SearchSettings = SearchSettings(),
    *,
    param_gather: bool = False,
    bf16_layers: int = 0,
    experts: bool | None = None,
    progress: Progress | None = None,
) -> tuple[SearchOutcome, tuple[Plan, ...]]:
    """:func:`search_outcome` under each FP8 recipe of ``recipes`` (None: none, the training's
    ``dtype`` throughout), the plans ranked together, fastest first (``settings.top_k`` of them):
    the search compares the precisions the user allows, since a recipe changes numerics and only
    the user can accept that. ``param_gather`` (``--fp8-param-gather``) applies to the recipes
    whose library gathers in FP8 (``RecipeRun.fp8_param_gather``), ``bf16_layers``
    (``--fp8-bf16-layers``) to every recipe, ``experts`` (``--fp8-experts``) to the recipes under
    which the stack can run the routed experts so (``TrainingSpec.fp8_experts``). Each plan's
    runner-up is the next best under its own recipe. A recipe under which no layout fits is left
    out while another fits.

    Args:
        model: a ModelSpec, a preset name or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` or a profile path.
        training: global batch, sequence length, precision and stack, without an FP8 recipe of its
            own unless ``recipes`` is empty (then it is searched as it is).
        recipes: the FP8 recipes to compare, None for none (``search --fp8 none,tensorwise``).
        settings: what to search for and how hard (``SearchSettings``), for each recipe.
        param_gather: all-gather weights in FP8 under the recipes whose library does.
        bf16_layers: the first and last layers kept in bf16 under every recipe.
        experts: the routed experts in FP8 (True) or in the training precision (False) under the
            recipes whose stack can; None: as the stack runs them.
        progress: called as progress(done, total) while each recipe's search runs.

    Returns:
        The searches' account (sizes and times summed, the ranked plans' layouts), and the
        ``settings.top_k`` fastest plans over every recipe, fastest first.

    Raises:
        SchemaError: a recipe the stack or cluster cannot run (``TrainingSpec``, ``check_precision``),
            or ``--fp8-param-gather`` where no listed recipe gathers in FP8.
        InfeasibleConfigError: no layout fits under any recipe (the first recipe's message).
    """
    wanted = tuple(dict.fromkeys(recipes)) or (training.fp8,)
    stack = stack_named(training.stack)
    gathers = {r for r in wanted if r is not None and stack.fp8_run(r).fp8_param_gather}
    chosen = {r for r in wanted if r is not None and stack.chooses_fp8_experts(r, experts)}
    _check_recipe_options(
        training,
        wanted,
        param_gather=param_gather and not gathers,
        bf16_layers=bf16_layers,
        experts=experts,
        chosen=chosen,
    )
    variants = [
        training.with_options(
            {
                "fp8": r,
                "fp8_param_gather": param_gather and r in gathers,
                "fp8_bf16_layers": bf16_layers if r else 0,
                "fp8_experts": experts if r in chosen else None,
            }
        )
        for r in wanted
    ]
    results: list[tuple[SearchOutcome, tuple[Plan, ...]]] = []
    first_error: InfeasibleConfigError | None = None
    for variant in variants:
        try:
            results.append(search_outcome(model, cluster, variant, settings, progress=progress))
        except InfeasibleConfigError as e:
            first_error = first_error or e
    if not results:
        assert first_error is not None
        raise first_error
    plans = sorted((p for _, found in results for p in found), key=lambda p: p.estimate.step_time_s)[: settings.top_k]
    outcomes = [o for o, _ in results]
    merged = SearchOutcome(
        ranked=tuple(Candidate(layout=p.layout, estimate=p.estimate) for p in plans),
        strategy=outcomes[0].strategy,
        space_size=sum(o.space_size for o in outcomes),
        evaluated=sum(o.evaluated for o in outcomes),
        outpaced=sum(o.outpaced for o in outcomes),
        complete=all(o.complete for o in outcomes),
        elapsed_s=sum(o.elapsed_s for o in outcomes),
        usable_memory_bytes=outcomes[0].usable_memory_bytes,
        points=tuple(point for o in outcomes for point in o.points),
    )
    return merged, tuple(plans)


def _check_recipe_options(
    training: TrainingSpec,
    recipes: Sequence[Fp8Recipe | None],
    *,
    param_gather: bool,
    bf16_layers: int,
    experts: bool | None,
    chosen: set[Fp8Recipe],
) -> None:
    """Refuse, as ``TrainingSpec`` refuses them and with its fix, the FP8 options no recipe of
    ``recipes`` takes: ``param_gather`` where none gathers in FP8 (True here means so),
    ``bf16_layers`` with no recipe at all, and ``experts`` where no recipe is ``chosen`` (none
    under which the stack runs the experts so).

    Raises:
        SchemaError: the spec's message for the first recipe (or none) with the option.
    """
    first = next((r for r in recipes if r is not None), None)
    if param_gather:
        training.with_options({"fp8": first, "fp8_param_gather": True})
    if bf16_layers and first is None:
        training.with_options({"fp8_bf16_layers": bf16_layers})
    if experts is not None and not chosen:
        training.with_options({"fp8": first, "fp8_experts": experts})


def check_replica_slots(replicas: int, model: ModelSpec, world_size: int) -> None:
    """Refuse more replica slots than any expert-parallel degree on ``world_size`` ranks leaves free:
    a rank hosts an expert at most once, so at ep it has E - E/ep free slots, most at the largest ep.
    A plan whose ep has fewer keeps the even placement (the refiner skips it); with none that has
    enough, the option would be dropped silently.

    Raises:
        SchemaError: naming the value, the bound and why.
    """
    experts = model.num_local_experts
    widest = min(experts, world_size)
    most = experts - experts // widest
    if replicas > most:
        raise SchemaError(
            f"--expert-replicas {replicas} is more than any rank has free: with {experts} experts a rank hosts each "
            f"at most once, so at most E - E/ep = {most} spare slots (ep {widest}) on {world_size} ranks; "
            f"give --expert-replicas {most} or less"
        )


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


def admission(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile) -> Callable[[Layout], None] | None:
    """What the training's stack refuses to run, as the search's check of each layout: the
    planner's runtime refuses what ``planner run`` would (``runtime_support.check_runnable``, on
    this cluster's kind of device), a stack with an export what its export cannot express
    (``export.targets.STACK_CHECKS``); so the best plan of ``search --stack X`` runs or exports.
    None for the stacks with neither (megatron-bridge, nemo-automodel, llm-foundry): they are
    priced, not checked.

    Raises:
        InfeasibleConfigError: the runtime does not build the model at all (``check_buildable``),
            before any layout is weighed; the message names another stack to plan for.
    """
    if training.stack is StackName.PLANNER_RUNTIME:
        try:
            check_buildable(model)
        except InfeasibleConfigError as e:
            raise InfeasibleConfigError(
                f"{e}; to plan for another framework, search with --stack (e.g. --stack megatron-lm)"
            ) from e
        cuda = cluster.pricing_device.kind is not DeviceKind.CPU
        return lambda layout: check_runnable(PlannedLayout(model, training, layout), cuda=cuda)
    check = STACK_CHECKS.get(training.stack)
    if check is None:
        return None
    return lambda layout: check(PlannedLayout(model, training, layout))
