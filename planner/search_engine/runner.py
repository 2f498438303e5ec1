"""A whole search: strategy over the space, refiners over the finalists, ranked result.

Never returns a layout that does not fit: when none does, raises InfeasibleConfigError saying
how close the best attempt came, what dominated its memory and what would make it fit.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from cost_models.layout_validity import missing_host_facts
from planner.schemas import (
    ClusterProfile,
    Layout,
    ModelSpec,
    Recompute,
    RoutingStats,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.choices import Choice, RecomputeChoice
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget, SearchSettings
from planner.search_engine.device_mapping import DeviceMappingRefiner
from planner.search_engine.evaluate import Evaluator, LayoutPoint, dominant_term
from planner.search_engine.intra_node_mapping import IntraNodeMappingRefiner
from planner.search_engine.layer_split import LayerSplitRefiner
from planner.search_engine.refiner import Refiner, refine_all
from planner.search_engine.space import SearchSpace
from planner.search_engine.strategy import Candidate, Progress, SearchStrategy, fastest_first

FINALISTS_PER_RESULT = 3
"""Finalists refined, per plan asked for (at least 10)."""
DEFAULT_REFINERS: tuple[Refiner, ...] = (LayerSplitRefiner(), DeviceMappingRefiner(), IntraNodeMappingRefiner())
"""Refiners every search applies to its finalists, in order (the local permutation inside nodes
composes with the node order chosen before it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOutcome:
    """The ranked feasible layouts and what it took to find them."""

    ranked: tuple[Candidate, ...]
    strategy: str
    space_size: int
    evaluated: int
    complete: bool
    elapsed_s: float
    outpaced: int = 0
    """Candidates left unpriced as certainly slower than the fastest (``SearchResult.outpaced``)."""
    usable_memory_bytes: float
    points: tuple[LayoutPoint, ...] = ()
    """Every layout evaluated, when the search was asked to record them (``record_points``)."""


def run_search(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    strategy: SearchStrategy,
    settings: SearchSettings = SearchSettings(),
    *,
    progress: Progress | None = None,
    refiners: Sequence[Refiner] = DEFAULT_REFINERS,
    routing: RoutingStats | None = None,
    admit: Callable[[Layout], None] | None = None,
) -> SearchOutcome:
    """Search ``model`` on ``cluster``; the ``settings.top_k`` fastest layouts that fit, fastest first.

    The strategy searches the space; its fastest finalists then pass through ``refiners`` in
    order (the CP-SAT layer split by default), and the refined layouts are ranked. With
    ``routing`` (a routing trace's statistics) every layout's MoE layers are priced at their
    busiest rank's load; without, routing is assumed uniform. ``admit`` refuses the layouts the
    training's stack cannot run (``Evaluator.admit``). The settings' vocabulary layouts,
    hierarchical sharding and constraints shape the space (``SearchSpace``); its budget, seed and
    memory margin the strategy and the evaluator.

    Raises:
        InfeasibleConfigError: no layout fits; the message says why and what would help.
    """
    start = time.perf_counter()
    budget = settings.budget or Budget()
    space = SearchSpace(
        model=model,
        training=training,
        world_size=cluster.world_size,
        devices_per_node=cluster.devices_per_node,
        hierarchical_sharding=settings.hierarchical_sharding,
    )
    if settings.vocabulary_layouts:
        space = replace(space, vocabulary_layouts=tuple(settings.vocabulary_layouts))
    if settings.constraints:
        space = space.constrained(settings.constraints)
        if space.size() == 0:
            raise InfeasibleConfigError(explain_over_constrained(space))
    evaluate = Evaluator(
        model,
        training,
        cluster,
        memory_margin=settings.memory_margin,
        routing=routing,
        record_points=settings.record_points,
        admit=admit,
        partial_recompute=_offers_partial_recompute(space),
    )
    finalists_wanted = max(10, FINALISTS_PER_RESULT * settings.top_k)
    result = strategy.search(space, evaluate, budget, seed=settings.seed, progress=progress, keep=finalists_wanted)
    offloads = settings.optimizer_offload or settings.activation_offload
    if not result.feasible and offloads and not missing_host_facts(cluster):
        # Nothing fits on the devices alone: every layout again, with the least offloads that fit
        evaluate.offload = True
        evaluate.optimizer_offload, evaluate.activation_offload = (
            settings.optimizer_offload,
            settings.activation_offload,
        )
        result = strategy.search(space, evaluate, budget, seed=settings.seed, progress=progress, keep=finalists_wanted)
    if not result.feasible:
        raise InfeasibleConfigError(explain_infeasible(space, evaluate))
    finalists = result.feasible[:finalists_wanted]
    refined = refine_all(finalists, refiners, evaluate, budget, seed=settings.seed)
    unique = {c.layout: c for c in refined}
    return SearchOutcome(
        ranked=fastest_first(list(unique.values()))[: settings.top_k],
        strategy=result.strategy,
        space_size=space.size() if result.space_size is None else result.space_size,
        evaluated=result.evaluated,
        outpaced=result.outpaced,
        complete=result.complete,
        elapsed_s=time.perf_counter() - start,
        usable_memory_bytes=evaluate.usable_memory_bytes,
        points=tuple(evaluate.points or ()),
    )


def _offers_partial_recompute(space: SearchSpace) -> bool:
    """Whether the space's constraints leave both no recompute and full recompute in: between
    them, some layers of each stage recomputed in full (``Layout.recompute_layers``)."""
    allowed = space.allowed("recompute")
    if allowed is None:
        return True
    modes = {v.recompute if isinstance(v, RecomputeChoice) else v for v in allowed}  # as ``Axis.choices`` reads them
    return {Recompute.NONE, Recompute.FULL} <= modes


def explain_over_constrained(space: SearchSpace) -> str:
    """Which constraint leaves a search no valid layout, and how many each one's removal frees."""
    given = ", ".join(f"{name} in {_values(values)}" for name, values in space.constraints)
    freed = []
    for name, _ in space.constraints:
        rest = tuple((n, v) for n, v in space.constraints if n != name)
        if (count := replace(space, constraints=rest).size()) > 0:
            freed.append(f"without the one on {name}, {count} layouts")
    culprit = "; ".join(freed) if freed else "no single one does it alone: loosen several"
    return (
        f"no valid layout of {space.model.name!r} on {space.world_size} ranks satisfies the constraints ({given}): "
        f"{culprit}{_flushes_hint(space)}"
    )


def _flushes_hint(space: SearchSpace) -> str:
    """What a step's pipeline flushes ask of every layout, to add to a no-valid-layout error; empty
    without flushes."""
    flushes = space.training.pipeline_flushes
    if flushes == 1:
        return ""
    return (
        f" (with --pipeline-flushes {flushes}, each of a pipeline's {flushes} schedules needs whole micro-batches, "
        "at least one per stage)"
    )


def _values(values: frozenset[Choice]) -> str:
    return "{" + ", ".join(sorted(str(v) for v in values)) + "}"


def explain_infeasible(space: SearchSpace, evaluate: Evaluator) -> str:
    """Why nothing fits, how close the best attempt came, and what would help."""
    usable_gib = evaluate.usable_memory_bytes / 2**30
    margin = f"{evaluate.memory_margin:.0%} kept free"
    miss = evaluate.closest_miss
    if miss is None and evaluate.first_refusal is not None:
        stack = space.training.stack
        return (
            f"no layout of {space.model.name!r} that {stack} runs fits or is valid ({evaluate.refused} refused, e.g. "
            f"{evaluate.first_refusal}); search with --stack for the framework that will run it "
            "(`planner stacks`), or as that message says"
        )
    if miss is None:
        return (
            f"no valid layout of {space.model.name!r} on {space.world_size} ranks: check that the global batch "
            f"{space.training.global_batch_size} has divisors matching the data-parallel degrees the cluster allows"
            + _flushes_hint(space)
        )
    need_gib = miss.memory.total_bytes / 2**30
    term, term_bytes = dominant_term(miss.memory)
    layout = miss.layout
    hints = [f"more devices (at least about {need_gib / usable_gib:.1f}x as many)"]
    # Under a pipeline ZeRO-1 shards all that ZeRO 2-3 would (cost_models.pipeline); one replica shards nothing.
    deepest = ZeroStage.OPTIMIZER if layout.pipeline_parallel_degree > 1 else ZeroStage.PARAMETERS
    if layout.data_parallel_degree > 1 and layout.zero_stage < deepest:
        hints.append(f"ZeRO-{int(deepest)}")
    if layout.recompute is not Recompute.FULL:
        hints.append("full recompute")
    if layout.micro_batch_size > 1:
        hints.append("a smaller micro-batch")
    if not (evaluate.offload and evaluate.optimizer_offload):
        hints.append("optimizer offload to host memory (a cluster that describes its hosts, and --optimizer-offload)")
    offloadable = layout.can_offload_activations
    if term == "activations" and offloadable and not (evaluate.offload and evaluate.activation_offload):
        hints.append("activation offload to host memory (a cluster that describes its hosts, and --activation-offload)")
    hints.append("a shorter sequence or a smaller global batch")
    host = ""
    if evaluate.host_miss is not None:  # what fit the devices with an offload did not fit the hosts
        host = f" With an offload, {evaluate.host_miss}."
        over = evaluate.host_miss.needed_bytes / evaluate.host_miss.usable_bytes
        hints.insert(1, f"more nodes for the hosts' memory (at least about {over:.1f}x as many)")
    return (
        f"no layout of {space.model.name!r} fits in {usable_gib:.1f} GiB per rank ({margin}). "
        f"The closest, {layout.describe()}, needs {need_gib:.1f} GiB, "
        f"most of it {term} ({term_bytes / 2**30:.1f} GiB).{host} "
        f"To fit, try: {', '.join(hints)}."
    )
