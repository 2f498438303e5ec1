"""The planner's Python API: one function per stage, what the CLI calls and what users import.

profile (under torchrun) -> search / estimate -> run (under torchrun) or dry_run -> tune / validate.
None of them prints: they return what they found, log with ``logging`` and report progress
through a callback; the CLI renders. torch is imported only inside the functions that need it
(profile, run, dry_run), so that importing the API, and planning on a laptop, stays light.

>>> import planner
>>> plans = planner.search("llama3-8b", "dgx-h100:1", planner.TrainingSpec(global_batch_size=64, seq_len=8192))
>>> est = planner.estimate("llama3-8b", "dgx-h100:1", planner.TrainingSpec(global_batch_size=64, seq_len=8192),
...                        planner.Layout(data_parallel_degree=8, tensor_parallel_degree=1,
...                                       pipeline_parallel_degree=1, micro_batch_size=1, zero_stage=2))
>>> est.fits  # ZeRO-1 would need more than the H100's 80 GB
True
"""

import functools
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from cost_models.estimate import estimate as _estimate
from cost_models.expert_parallel import dropped_share, sent_bytes_per_step
from cost_models.layer_work import profile_gemm_shapes
from cost_models.schedule_timeline import Timeline, estimate_timeline
from cost_models.stage_devices import stage_devices, uniformly_slowest
from planner.export.targets import ExportTarget
from planner.export.targets import export as _export
from planner.inputs import load_cluster, load_model, save_cluster
from planner.placement_comparison import PlacementComparison
from planner.placement_comparison import compare_placements as _compare_placements
from planner.plans import load_plan, make_plan, save_plan
from planner.replanning import Replan
from planner.routing_trace import load_routing_stats
from planner.schemas import (
    Alternative,
    ClusterProfile,
    DeviceKind,
    DType,
    Estimate,
    Layout,
    ModelSpec,
    OnFault,
    Plan,
    RoutingStats,
    RunReport,
    TrainingSpec,
    VocabularyLayout,
)
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import num_micro_batches
from planner.schemas.layout import check_experts
from planner.schemas.model import check_seq_len
from planner.schemas.runtime_support import check_runnable
from planner.search_engine import StrategyName, make_strategy
from planner.search_engine.evaluate import DEFAULT_MEMORY_MARGIN
from planner.search_engine.expert_placement import ExpertPlacementRefiner
from planner.search_engine.refiner import Refiner
from planner.search_engine.runner import DEFAULT_REFINERS, SearchOutcome, run_search
from planner.search_engine.space import Choice
from planner.search_engine.strategy import Budget, Progress, SearchStrategy
from planner.tuning.settings import Selection, TuneSettings

logger = logging.getLogger(__name__)

REPLAN_CANDIDATES = 10
"""The fastest layouts a re-plan considers, in order, for the first the runtime runs."""

if TYPE_CHECKING:  # the modules behind these import torch (runtime) or scipy (tuning): loaded on use
    from planner.tuning.tuner import RunTrial, TuneResult
    from runtime.dry_run import DryRunResult

__all__ = [
    "Budget",
    "ExportTarget",
    "OptimizerName",
    "Selection",
    "StrategyName",
    "TuneSettings",
    "compare_placements",
    "dropped_token_share",
    "dry_run",
    "estimate",
    "expert_traffic",
    "load_cluster",
    "load_model",
    "load_plan",
    "make_plan",
    "profile",
    "replan",
    "run",
    "save_plan",
    "search",
    "search_outcome",
    "tune",
    "validate",
]
# ``export`` is planner.api.export only: ``planner.export`` is the exports' subpackage, which an
# attribute of that name on the package would hide (see planner/__init__.py).


class OptimizerName(StrEnum):
    """Optimizers the runtime offers."""

    ADAMW = "adamw"
    SGD = "sgd"


def estimate(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    layout: Layout,
    *,
    routing_trace: Path | str | None = None,
) -> Estimate:
    """Predict per-rank memory and step time of ``layout`` for ``model`` on ``cluster``.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` (``dgx-a100-80g:16``) or a profile path.
        training: global batch (sequences), sequence length (tokens), dtype, optimizer.
        layout: parallel degrees, ZeRO stage, micro-batch, recompute, schedule.
        routing_trace: a routing trace file of an MoE model: its MoE layers are priced at their
            busiest expert-parallel rank under the layout's placement; None assumes uniform routing.

    Returns:
        The Estimate: seconds per step, tokens/s, FLOPs, MFU, bytes per rank by category.

    Raises:
        SchemaError: an input could not be read or is invalid, or the sequence is longer than the
            model allows (``ModelSpec.max_seq_len``).
        InfeasibleConfigError: the layout does not divide the model, batch or cluster.
    """
    model_spec = _model_for(model, training)
    cluster_profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    _note_mixed_devices(cluster_profile)
    check_experts(model_spec, layout)  # first: its messages say which expert-parallel degrees would do
    routing = _routing(routing_trace, model_spec)
    return _estimate(model_spec, training, cluster_profile, layout, routing=routing)


def search_outcome(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    *,
    strategy: SearchStrategy | StrategyName | str = StrategyName.EXHAUSTIVE,
    budget: Budget | None = None,
    top_k: int = 5,
    seed: int = 0,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    storage: str | None = None,
    progress: Progress | None = None,
    refiners: Sequence[Refiner] = DEFAULT_REFINERS,
    routing_trace: Path | str | None = None,
    expert_replicas: int = 0,
    vocabulary_layouts: Sequence[VocabularyLayout] | None = None,
    hierarchical_sharding: bool = True,
    constraints: Mapping[str, Iterable[Choice]] | None = None,
    record_points: bool = False,
) -> tuple[SearchOutcome, tuple[Plan, ...]]:
    """Search layouts; the search's account (space size, evaluations, time) and the ranked plans.

    Args:
        model, cluster: as for :func:`estimate`; a cluster given as a string is recorded in the plans.
        training: global batch (sequences), sequence length (tokens), dtype.
        strategy: a SearchStrategy, or the name of one: a StrategyName or its value ("exhaustive", "optuna").
        budget: trials and seconds the strategy may spend (default: no limit; Optuna 400 trials).
        top_k: plans to return, fastest first.
        seed: seed of the sampler and the solver.
        memory_margin: share of device memory kept free (allocator fragmentation).
        storage: Optuna study storage URL (e.g. sqlite:///search.db) for a resumable search.
        progress: called as progress(done, total) while searching.
        refiners: applied in order to the strategy's finalists (default ``DEFAULT_REFINERS``: the
            CP-SAT layer split, then the rank-to-device map's node order and each node's local order).
        routing_trace: a routing trace file (``planner.routing_trace``) of the model: every MoE
            layer is then priced at its busiest rank's load, and the experts of finalists with
            expert parallelism are placed from it (``ExpertPlacementRefiner``). Without one,
            routing is assumed uniform.
        expert_replicas: with ``routing_trace``, spare expert slots per expert-parallel rank and
            MoE layer, filled with replicas of the hottest experts (DeepSeek's EPLB redundant experts).
        vocabulary_layouts: where the vocabulary layers may go (default: pinned, or split over
            the pipeline by Vocabulary Parallelism's Algorithm 2).
        hierarchical_sharding: whether ZeRO may shard in node-sized groups (HSDP) and keep ZeRO-3's
            weights over a node-sized secondary partition after the forward (hpZ); the planner's
            own runtime runs both, but not hpZ beside tensor parallelism.
        constraints: values the search may give some axes, by axis name (``tp``, ``pp``, ``dp``,
            ``ep``, ``micro_batch_size``, ``schedule``, ``virtual_stages``, ``zero_stage``,
            ``recompute``, ...; ``planner.search_engine.space.AXES``), e.g. ``{"tp": [8],
            "pp": range(1, 17)}``; applied before anything is enumerated, and a search they
            leave without a valid layout says which constraint did it.
        record_points: keep every evaluated layout's predicted time and peak memory in the
            outcome's ``points`` (for a plot; layouts that do not fit are then priced in full too).

    Returns:
        The search's outcome, and its top-k plans fastest first, each naming its runner-up.

    Raises:
        SchemaError: an input could not be read or is invalid, the sequence is longer than the model
            allows (``ModelSpec.max_seq_len``), or ``strategy`` names no strategy.
        InfeasibleConfigError: no layout fits; the message says how close one came and what would help.
    """
    if expert_replicas < 0:
        raise SchemaError(f"--expert-replicas {expert_replicas} must be 0 or more: spare expert slots per rank")
    if expert_replicas and routing_trace is None:
        raise SchemaError(
            f"--expert-replicas {expert_replicas} needs a routing trace (--routing-trace): it shows which experts are "
            "hot enough to replicate"
        )
    model_spec = _model_for(model, training)
    cluster_spec = cluster if isinstance(cluster, str) else cluster.name
    cluster_profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    _note_mixed_devices(cluster_profile)
    chosen = make_strategy(strategy, storage=storage) if isinstance(strategy, str) else strategy
    routing = _routing(routing_trace, model_spec)
    if routing is not None:
        refiners = (*refiners, ExpertPlacementRefiner(stats=routing, replicas=expert_replicas))
    outcome = run_search(
        model_spec,
        training,
        cluster_profile,
        chosen,
        budget=budget,
        top_k=top_k,
        seed=seed,
        memory_margin=memory_margin,
        progress=progress,
        refiners=refiners,
        routing=routing,
        vocabulary_layouts=vocabulary_layouts,
        hierarchical_sharding=hierarchical_sharding,
        constraints=constraints,
        record_points=record_points,
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
    *,
    strategy: SearchStrategy | StrategyName | str = StrategyName.EXHAUSTIVE,
    budget: Budget | None = None,
    top_k: int = 5,
    seed: int = 0,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    storage: str | None = None,
    progress: Progress | None = None,
    refiners: Sequence[Refiner] = DEFAULT_REFINERS,
    routing_trace: Path | str | None = None,
    expert_replicas: int = 0,
    vocabulary_layouts: Sequence[VocabularyLayout] | None = None,
    hierarchical_sharding: bool = True,
    constraints: Mapping[str, Iterable[Choice]] | None = None,
) -> tuple[Plan, ...]:
    """The fastest layouts that fit, as plans: :func:`search_outcome` without the search's account.

    Args:
        model, cluster, training, strategy, budget, top_k, seed, memory_margin, storage, progress,
            refiners, routing_trace, expert_replicas, vocabulary_layouts, hierarchical_sharding,
            constraints: as for :func:`search_outcome`.

    Returns:
        Up to ``top_k`` plans, fastest first.

    Raises:
        SchemaError, InfeasibleConfigError: as :func:`search_outcome`.
    """
    _, plans = search_outcome(
        model,
        cluster,
        training,
        strategy=strategy,
        budget=budget,
        top_k=top_k,
        seed=seed,
        memory_margin=memory_margin,
        storage=storage,
        progress=progress,
        refiners=refiners,
        routing_trace=routing_trace,
        expert_replicas=expert_replicas,
        vocabulary_layouts=vocabulary_layouts,
        hierarchical_sharding=hierarchical_sharding,
        constraints=constraints,
    )
    return plans


def replan(
    plan: Plan | str | Path,
    cluster: ClusterProfile | str,
    *,
    checkpoint_dir: str | Path | None = None,
    strategy: SearchStrategy | StrategyName | str = StrategyName.EXHAUSTIVE,
    budget: Budget | None = None,
    seed: int = 0,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    progress: Progress | None = None,
) -> Replan:
    """Search ``plan``'s model and training again on ``cluster`` (the devices left after a
    failure, or more), for a layout the runtime runs and a checkpoint of the old plan loads into.

    The global batch, sequence length and precision stay: the micro-batches are reshaped to the
    new data-parallel degree (``planner.replanning``).

    Args:
        plan: the plan (or its file) that ran.
        cluster: the new devices: a preset NAME:NODES or a profile (file).
        checkpoint_dir: a checkpoint folder of the old run: its newest complete checkpoint must
            load into the new plan (same model and global batch size).
        strategy, budget, seed, memory_margin, progress: as for :func:`search_outcome`.

    Returns:
        The old plan, the new one and the checkpoint's step, for ``planner.replanning.summary``.

    Raises:
        SchemaError: an input could not be read, or no complete checkpoint is in ``checkpoint_dir``.
        InfeasibleConfigError: no layout fits or none of the fastest runs on this runtime, or the
            checkpoint cannot load into the new plan.
    """
    old = plan if isinstance(plan, Plan) else load_plan(plan)
    step = None
    if checkpoint_dir is not None:  # before the search: the new plan keeps the model and global batch
        from runtime.checkpoint_meta import check_loadable

        step = int(check_loadable(Path(checkpoint_dir), old.model, old.training.global_batch_size)["step"])
    plans = search(
        old.model,
        cluster,
        old.training,
        strategy=strategy,
        budget=budget,
        top_k=REPLAN_CANDIDATES,
        seed=seed,
        memory_margin=memory_margin,
        progress=progress,
    )
    refusals: list[str] = []
    for candidate in plans:
        try:
            check_runnable(candidate, cuda=candidate.cluster.device_kind is not DeviceKind.CPU)
        except InfeasibleConfigError as e:
            refusals.append(str(e))
            continue
        return Replan(old=old, new=candidate, checkpoint_step=step)
    raise InfeasibleConfigError(
        f"none of the {len(plans)} fastest layouts on {cluster if isinstance(cluster, str) else cluster.name} runs "
        f"on this runtime; the first: {refusals[0]}"
    )


def compare_placements(plan: Plan | str | Path, routing_trace: Path | str) -> PlacementComparison | None:
    """A plan's expert placement beside round-robin on a routing trace: the hottest rank's and the
    mean rank's routed tokens, and the tokens that cross ranks and nodes between MoE layers.

    Args:
        plan: a Plan or a plan file; without a placement its experts sit in contiguous blocks.
        routing_trace: a routing trace file (``planner.routing_trace``) of the plan's model.

    Returns:
        Both placements' figures, cross-node tokens for the expert-parallel group that sends the
        most (``planner.placement_comparison``); None when the plan places no experts (a dense
        model, or ep = 1).

    Raises:
        SchemaError: the plan or the trace cannot be read, or the trace is of another model.
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
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
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
    profile = cluster if cluster is not None else load_cluster(loaded.cluster.spec)
    return estimate_timeline(loaded.model, loaded.training, profile, loaded.layout)


def export(plan: Plan | str | Path, target: ExportTarget | str) -> str:
    """A plan as another training framework's config or arguments (``planner.export``).

    Args:
        plan: a Plan or a plan file.
        target: "torchtitan" (a TOML job config), "megatron" (Megatron-LM arguments) or
            "deepspeed" (a JSON config), or an ``ExportTarget``.

    Returns:
        The export's text, ready to write to a file.

    Raises:
        SchemaError: the plan cannot be read, or the target is unknown.
        InfeasibleConfigError: the plan uses a feature the target cannot express (one line
            naming it, why, and what to plan instead); nothing is dropped silently.
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
    return _export(loaded, target)


def profile(
    output: str | Path = "cluster.json",
    *,
    quick: bool = False,
    model: ModelSpec | str | None = None,
    seq_len: int = 512,
    dtype: DType | None = None,
    timeout_s: float = 60.0,
    inject_link_delay: tuple[tuple[int, int, float], ...] = (),
    simulate_nodes: int | None = None,
    inject_fault: tuple[int, str, str] | None = None,
    layer_micro_batches: tuple[int, ...] | None = None,
    layer_repeats: int | None = None,
) -> int:
    """Measure the cluster this job runs on; call it on every rank under torchrun.

    Args:
        output: where rank 0 writes the ClusterProfile (JSON).
        quick: fewer sizes and repeats (seconds instead of a minute, wider spreads).
        model: also time this model's own layers and GEMM shapes (the cost model's view of them).
        seq_len: tokens per sequence of the model's shapes.
        dtype: time GEMMs and layers in this precision only (default: fp32 and bf16).
        timeout_s: seconds a rank waits for a peer before the run fails.
        inject_link_delay, simulate_nodes, inject_fault: testing aids (profiler.settings).
        layer_micro_batches: testing aid: time the model's layers at these micro-batch sizes
            only (default: profiler.settings.ProfileSettings.layer_micro_batches).
        layer_repeats: testing aid: repeats of each timing of the model's layers, its optimizer
            step, the pipeline slot and the sharded units (default: ProfileSettings.layer_repeats).

    Returns:
        0 when every phase was measured; profiler.run.FAILED_EXIT_CODE (3) when a rank failed,
        in which case rank 0 wrote what it measured, marked incomplete, and the culprit is logged.
        Rank 0 writes ``output`` either way.

    Raises:
        ProfileError: not under torchrun, or fewer than 2 ranks.
        SchemaError: ``model`` could not be read.
    """
    from profiler.run import profile as run_profile  # torch: only for the commands that need it
    from profiler.settings import ProfileSettings
    from profiler.settings import quick as quick_settings

    model_spec = load_model(model) if isinstance(model, str) else model
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    settings = ProfileSettings(
        timeout_s=timeout_s,
        model=model_spec,
        model_gemm_shapes=profile_gemm_shapes(model_spec, seq_len, world_size) if model_spec else (),
        seq_len=seq_len,
        inject_link_delay=inject_link_delay,
        simulate_nodes=simulate_nodes,
        inject_fault=inject_fault,
    )
    if dtype is not None:
        settings = replace(settings, gemm_dtypes=(dtype,))
    if layer_micro_batches is not None:
        settings = replace(settings, layer_micro_batches=layer_micro_batches)
    if layer_repeats is not None:
        settings = replace(settings, layer_repeats=layer_repeats)
    outcome = run_profile(quick_settings(settings) if quick else settings)
    if outcome.profile is not None:
        save_cluster(outcome.profile, output)
        logger.info("wrote %s", output)
    elif outcome.incomplete is not None:
        Path(output).write_text(json.dumps(outcome.incomplete, indent=2) + "\n")
        logger.warning("wrote the incomplete profile to %s", output)
    return outcome.exit_code


def run(
    plan: str | Path,
    *,
    steps: int = 10,
    report: str | Path = "report.json",
    warmup_steps: int = 1,
    seed: int = 0,
    optimizer: OptimizerName = OptimizerName.ADAMW,
    lr: float = 1e-3,
    data: str | Path | None = None,
    timeout_s: float = 300.0,
    trace_routing: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    inject_fault: tuple[int, int, str, int] | None = None,
    on_fault: OnFault = OnFault.WARN,
    elastic: bool = False,
) -> RunReport | None:
    """Train with a plan file for a few steps; call it on every rank under torchrun.

    Args:
        plan: the plan file (the report records its SHA-256).
        steps: training steps.
        report: where rank 0 writes the RunReport (JSON).
        warmup_steps: first steps left out of the measured step time.
        seed: seed of the initialisation and the synthetic data.
        optimizer: adamw, or sgd for exact parity checks.
        lr: learning rate.
        data: a token file (uint16); None: synthetic tokens.
        timeout_s: seconds a rank waits for a peer.
        trace_routing: where rank 0 writes the run's routing trace (an MoE model's expert ids per
            token and layer, ``runtime.routing_trace``); None: no trace.
        checkpoint_dir: where every rank saves its part of each checkpoint (``runtime.checkpoint``:
            model, optimizer, step and random state; atomic); None: no checkpoints.
        checkpoint_every: steps between checkpoints (0: one after the last step).
        resume: continue from the newest complete checkpoint in ``checkpoint_dir``, taken under
            the same plan (the steps after it compute what an uninterrupted run computes) or under
            another layout of the same model and global batch (:func:`replan`; loaded resharded).
        inject_fault: testing aid, (rank, step, "exit" | "hang" | "slow" | "slow-link", peer)
            (``runtime.run.RunSettings.inject_fault``).
        on_fault: what a straggler or a slow link does to the run (``runtime.straggler_watch``): WARN logs it
            and records it in the report; EXIT also stops every rank after that step (a
            checkpoint is taken there, if they are) and raises StragglerFound.
        elastic: for torchrun's elastic restarts (``planner launch --elastic``): continue from
            the newest complete checkpoint in ``checkpoint_dir`` whenever there is one, and on a
            world size other than the plan's, run the plan rank 0 searches for the ranks there
            are (``planner.elastic``: the plan's cluster cut to them, written to
            ``checkpoint_dir``/plans/world-N.json) instead of refusing.

    Returns:
        On rank 0 the RunReport (measured step times, per-rank peak memory, losses beside the
        plan's predictions); None on the other ranks.

    Raises:
        SchemaError: not under torchrun (RANK unset), or the plan file is unreadable.
        InfeasibleConfigError: the plan is for another world size (unless elastic) or device, or
            (elastic) no layout fits the job's ranks.
        JobFailed: a rank died, hung past ``timeout_s`` or was stopped; the message names the
            ranks that stopped responding and where they last were (every surviving rank raises it).
        StragglerFound: under ``OnFault.EXIT``, a rank was far slower than its peers; the message
            names it and its host (every rank raises it; rank 0 has written the report).
    """
    if "RANK" not in os.environ:
        raise SchemaError(f"planner run runs on every rank under torchrun: `planner launch {plan}` prints the command")
    if resume and checkpoint_dir is None:
        raise SchemaError("--resume continues from a checkpoint: give its folder with --checkpoint-dir")
    if elastic and checkpoint_dir is None:
        raise SchemaError("--elastic resumes each restart from a checkpoint: give their folder with --checkpoint-dir")
    if checkpoint_every < 0:
        raise SchemaError(f"--checkpoint-every {checkpoint_every} must be 0 (after the last step) or more")
    loaded = load_plan(plan)  # a bad plan is refused before torch is imported
    from planner.elastic import plan_for_world
    from runtime.run import RunSettings
    from runtime.run import run as run_plan

    replan = None
    if elastic:
        assert checkpoint_dir is not None
        replan = functools.partial(plan_for_world, loaded, checkpoint_dir=Path(checkpoint_dir))

    settings = RunSettings(
        plan_path=Path(plan),
        report_path=Path(report),
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        optimizer=str(optimizer),
        lr=lr,
        data=Path(data) if data is not None else None,
        timeout_s=timeout_s,
        trace_routing=Path(trace_routing) if trace_routing is not None else None,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        checkpoint_every=checkpoint_every,
        resume=resume,
        inject_fault=inject_fault,
        on_fault=on_fault,
        replan=replan,
    )
    return run_plan(settings, loaded)


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
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
    routing = _routing(routing_trace, loaded.model)
    m = num_micro_batches(loaded.training.global_batch_size, loaded.layout)
    return sent_bytes_per_step(loaded.model, loaded.training, loaded.layout, m, routing)


def dropped_token_share(
    model: ModelSpec | str, training: TrainingSpec, routing_trace: Path | str | None = None
) -> float:
    """Share of the routed (token, expert) pairs that ``training``'s capacity factor drops
    (``cost_models.expert_parallel.dropped_share``).

    Args:
        model: a preset name or a model spec.
        training: its ``moe_capacity_factor`` (None: dropless) and ``moe_pad_to_capacity``.
        routing_trace: a routing trace file of the model; None assumes uniform routing.

    Returns:
        The dropped share of all routed pairs, over the MoE layers: 0 dropless, padded, or for a
        dense model.

    Raises:
        SchemaError: an unknown model, or a trace that cannot be read or is of another model.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    routing = _routing(routing_trace, model_spec)
    return dropped_share(model_spec, training, routing)


def dry_run(
    plan: Plan | str | Path, rank: int = 0, *, optimizer: OptimizerName = OptimizerName.ADAMW
) -> "DryRunResult":
    """Trace one rank's training step under fake tensors and a fake process group (no devices,
    no torchrun): its peak memory beside the plan's estimate, before renting the cluster.

    A process can set up the fake process group once: trace each further rank in a fresh process.

    Args:
        plan: a Plan or a plan file.
        rank: the rank of the plan's world to trace.
        optimizer: as for :func:`run`.

    Returns:
        The rank's traced peak bytes (by category), the estimate's bytes for its stage, and seconds taken.

    Raises:
        InfeasibleConfigError: ``rank`` is outside the plan's world, or the plan recomputes modules
            the runtime does not checkpoint (``schemas.runtime_support.check_recompute_modules``).
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)  # a bad plan is refused before torch is imported
    from runtime.dry_run import dry_run as trace

    return trace(loaded, rank, optimizer=str(optimizer))


def tune(
    model: ModelSpec | str,
    cluster: str,
    training: TrainingSpec,
    settings: TuneSettings | None = None,
    *,
    calibrate: bool = True,
    save_calibration: str | Path | None = None,
    run_trial: "RunTrial | None" = None,
    progress: Progress | None = None,
) -> "TuneResult":
    """Run the search's best plans for a few steps each as trials of an Optuna study, fit the
    cluster's calibration from the measured ones and store it in the profile.

    A stopped tune resumes: a plan the study finished (measured or failed) never runs again.

    Args:
        model: a ModelSpec, a preset name or a config file.
        cluster: a preset ``NAME:NODES`` or a profile path (recorded in the plans).
        training: global batch (sequences), sequence length (tokens), dtype.
        settings: plans to run (top-k, selection), steps, study storage and name, launcher
            template, seconds per trial, working directory (default: TuneSettings()).
        calibrate: store the fitted calibration in a profile file.
        save_calibration: that file (default: the ``cluster`` file; a preset needs one).
        run_trial: how a plan runs (default: its job, locally with torchrun or through the launcher).
        progress: called as progress(done, total) over the plans.

    Returns:
        Every finished trial of the study, the fitted calibration, the figures before and after
        it, and where it was stored.

    Raises:
        SchemaError: an input or the launcher template is invalid; ``calibrate`` with a preset
            cluster and no ``save_calibration``.
        InfeasibleConfigError: no layout fits.
    """
    from planner.tuning.launcher import check_template
    from planner.tuning.settings import pool_size, select_plans
    from planner.tuning.study import study_name
    from planner.tuning.tuner import calibration_target, run_trial_job, run_trials, summarize

    settings = settings or TuneSettings()
    target = calibration_target(
        cluster, calibrate=calibrate, save_to=Path(save_calibration) if save_calibration else None
    )
    if settings.launcher is not None:
        check_template(settings.launcher)
    model_spec = load_model(model) if isinstance(model, str) else model
    profile = load_cluster(cluster)
    ranked = search(  # the plans run on the planner's runtime, which shards over whole groups only
        model_spec,
        cluster,
        training,
        top_k=pool_size(settings),
        vocabulary_layouts=settings.vocabulary_layouts,
        hierarchical_sharding=False,
    )
    plans = select_plans(ranked, settings)
    name = settings.study_name or study_name(model_spec.name, training, profile)
    records, ran = run_trials(plans, settings, name, run_trial=run_trial or run_trial_job, progress=progress)
    result = summarize(study_name=name, records=records, cluster=profile, source=f"{settings.storage} {name}", ran=ran)
    if result.calibration is None or target is None:
        return result
    save_cluster(profile.model_copy(update={"calibration": result.calibration}), target)
    return replace(result, calibration_path=target)


def validate(storage: str = "sqlite:///tune.db", study: str | None = None, cluster: str | None = None) -> "TuneResult":
    """How right the model was on a stored tune's measured plans, before and after calibration.

    Args:
        storage: the Optuna storage a tune wrote to (nothing is created).
        study: the study's name (default: the storage's only or newest study).
        cluster: the profile to predict with (default: the one the plans were made on).

    Returns:
        The study's trials, the calibration fitted on them and the figures before and after it.

    Raises:
        SchemaError: no such storage, study or finished trial; ``cluster`` unreadable.
    """
    from planner.tuning.study import stored_records
    from planner.tuning.tuner import summarize

    name, finished = stored_records(storage, study)
    profile = load_cluster(cluster or finished[0].plan.cluster.spec)
    return summarize(study_name=name, records=finished, cluster=profile, source=f"{storage} {name}")


def stage_device_names(cluster: ClusterProfile | str, layout: Layout) -> tuple[str, ...]:
    """The device type that prices each pipeline stage of ``layout`` on ``cluster``, in pipeline
    order: its ranks' own, the slowest of them where a stage spans several
    (``cost_models.stage_devices``)."""
    profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return tuple(device.name for device in stage_devices(profile, layout))


def homogeneous_estimate(
    model: ModelSpec | str, cluster: ClusterProfile | str, training: TrainingSpec, layout: Layout
) -> Estimate:
    """``layout`` priced with every rank of ``cluster`` as its slowest device with the smallest
    memory: the homogeneous treatment of a mixed cluster, against which pricing each stage on its
    own devices is measured (the estimate itself on a cluster of one device type)."""
    profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return _estimate(_model_for(model, training), training, uniformly_slowest(profile), layout)


def _model_for(model: ModelSpec | str, training: TrainingSpec) -> ModelSpec:
    """The model (loaded if named) where it meets the training: every estimate and search (and so
    every tune and plan) passes here, and a sequence longer than the model allows stops here.

    Raises:
        SchemaError: the model cannot be read, or ``training.seq_len`` exceeds ``max_seq_len``.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    check_seq_len(model_spec, training.seq_len)
    return model_spec


def _note_mixed_devices(cluster: ClusterProfile) -> None:
    """One line saying how a cluster of mixed device types is priced (``cost_models.stage_devices``)."""
    if cluster.has_mixed_devices:
        logger.info(
            "note: %s mixes %s; each pipeline stage is priced on its own ranks' devices, a stage spanning "
            "several types as the slowest (%s) with the smallest memory (%.1f GB)",
            cluster.name,
            " and ".join(d.name for d in cluster.devices),
            cluster.pricing_device.name,
            cluster.pricing_device.memory_bytes / 1e9,
        )


def _routing(routing_trace: Path | str | None, model: ModelSpec) -> RoutingStats | None:
    """The statistics of an optional routing trace of ``model`` (``planner.routing_trace``)."""
    return load_routing_stats(routing_trace, model) if routing_trace is not None else None
