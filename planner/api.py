"""The planner's Python API: what the CLI calls, and what users import.

>>> import planner
>>> est = planner.estimate("llama3-8b", "dgx-h100:1", planner.TrainingSpec(global_batch_size=64, seq_len=8192),
...                        planner.Layout(data_parallel_degree=8, tensor_parallel_degree=1,
...                                       pipeline_parallel_degree=1, micro_batch_size=1, zero_stage=1))
"""

from cost_models.estimate import estimate as _estimate
from planner.inputs import load_cluster, load_model
from planner.plans import load_plan, make_plan, save_plan
from planner.schemas import Alternative, ClusterProfile, Estimate, Layout, ModelSpec, Plan, TrainingSpec
from planner.search_engine import StrategyName, make_strategy
from planner.search_engine.evaluate import DEFAULT_MEMORY_MARGIN
from planner.search_engine.runner import SearchOutcome, run_search
from planner.search_engine.strategy import Budget, Progress, SearchStrategy

__all__ = ["estimate", "load_cluster", "load_model", "load_plan", "save_plan", "search", "search_outcome"]


def estimate(model: ModelSpec | str, cluster: ClusterProfile | str, training: TrainingSpec, layout: Layout) -> Estimate:
    """Predict per-rank memory and step time of ``layout`` for ``model`` on ``cluster``.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` (``dgx-a100-80g:16``) or a profile path.
        training: global batch (sequences), sequence length (tokens), dtype, optimizer.
        layout: parallel degrees, ZeRO stage, micro-batch, recompute, schedule.

    Returns:
        The Estimate: seconds per step, tokens/s, FLOPs, MFU, bytes per rank by category.

    Raises:
        SchemaError: an input could not be read or is invalid.
        InfeasibleConfigError: the layout does not divide the model, batch or cluster.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    cluster_profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return _estimate(model_spec, training, cluster_profile, layout)


def search_outcome(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    *,
    strategy: SearchStrategy | StrategyName = StrategyName.EXHAUSTIVE,
    budget: Budget | None = None,
    top_k: int = 5,
    seed: int = 0,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    storage: str | None = None,
    progress: Progress | None = None,
) -> tuple[SearchOutcome, tuple[Plan, ...]]:
    """Search layouts; the search's account (space size, evaluations, time) and the ranked plans.

    Args:
        model, cluster: as for :func:`estimate`; a cluster given as a string is recorded in the plans.
        training: global batch (sequences), sequence length (tokens), dtype.
        strategy: a SearchStrategy, or the name of one ("exhaustive", "optuna").
        budget: trials and seconds the strategy may spend (default: no limit; Optuna 400 trials).
        top_k: plans to return, fastest first.
        memory_margin: share of device memory kept free (allocator fragmentation).
        storage: Optuna study storage URL (e.g. sqlite:///search.db) for a resumable search.
        progress: called as progress(done, total) while searching.

    Raises:
        InfeasibleConfigError: no layout fits; the message says how close one came and what would help.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    cluster_spec = cluster if isinstance(cluster, str) else cluster.name
    cluster_profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    chosen = make_strategy(strategy, storage=storage) if isinstance(strategy, StrategyName) else strategy
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
    model: ModelSpec | str, cluster: ClusterProfile | str, training: TrainingSpec, **options: object
) -> tuple[Plan, ...]:
    """The ranked plans of :func:`search_outcome` (same arguments), fastest first."""
    return search_outcome(model, cluster, training, **options)[1]  # type: ignore[arg-type]
