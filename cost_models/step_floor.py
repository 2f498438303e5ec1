"""A floor under a layout's step time that every layout differing from it only in recompute,
ZeRO stage, sharding groups and pipeline schedule shares: a search skips those whose floor is
above what it has already found (``planner.search_engine.exhaustive``).

Why it is a floor, from ``estimate``'s sum. A step takes shared (m T_slowest + bubble), the
vocabulary collectives m V_slowest, point-to-point transfers, the exposed data-parallel
collectives and the optimizer step, each term at least 0, with T_s = ``StageTime.total_s``
less its vocabulary part V_s and ``shared`` in (0, 1] such that shared (m max_s T_s + bubble)
is at least m mean_s T_s (``shared_cores.shared_core_factor``; 1 on unshared devices). So

    step >= m (1/p) sum_s T_s,

and, on devices a rank does not share (``shared`` is 1), step >= m T_max + bubble(T_max), the
bubble linear in the slowest stage's time (``pipeline.bubble_s``): the bubble of the layout's own
schedule over the mean stage adds to that floor. The sum only grows from the layout's relaxed
form (``relaxed``: no recompute, no ZeRO, no sharding groups, one chunk per stage under 1F1B) to
any layout that differs from it in those:
- recompute adds ``recompute_s`` (and re-runs collectives), never less compute;
- ZeRO 2-3 add each sharded unit's own time (``sharding.sharded_unit_s``), 0 without them;
- the schedule and virtual stages move layers and vocabulary shares between stages, which
  changes each stage's sum but not the sum over stages: every layer's time, every expert load,
  each share of the embedding and output layer and every parameter's gradient accumulation are
  counted once, on whichever stage holds it (each term is linear in what a stage holds).
The floor is therefore m (1/p) sum_s T_s of the relaxed layout (``mean_stage_s``), plus the
bubble where cores are not shared (``floor_of``). It holds where every stage is priced on the
same device and the terms are not rescaled: on a cluster of mixed device types a stage's time
depends on which devices hold which layers, and a calibration scales terms by factors below 1 as
well; there the floor is 0 (it rules nothing out).
"""

from dataclasses import replace

from cost_models.pipeline import bubble_s
from cost_models.timing import stage_times
from planner.schemas import ClusterProfile, Layout, ModelSpec, Recompute, Schedule, TrainingSpec, ZeroStage
from planner.schemas.geometry import num_micro_batches, pipeline_schedules
from planner.schemas.routing import RoutingStats

RELAXED_FIELDS = frozenset(
    {
        "recompute",
        "recompute_modules",
        "recompute_layers",
        "zero_stage",
        "sharding_group_size",
        "secondary_partition_size",
        "schedule",
        "virtual_stages",
    }
)
"""Layout fields in which layouts may differ and share one floor (``relaxed``)."""
FACTOR_FIELDS = frozenset({"data_parallel_degree", "pipeline_parallel_degree", "micro_batch_size", "virtual_stages"})
"""Layout fields ``floor_factor`` reads (the micro-batches and the bubble's stages and chunks)."""


def relaxed(layout: Layout) -> Layout:
    """``layout`` without recompute, ZeRO and sharding groups, one chunk per stage under 1F1B:
    the layout of the least stage time of those that differ from it only in ``RELAXED_FIELDS``."""
    return replace(
        layout,
        recompute=Recompute.NONE,
        recompute_layers=None,
        zero_stage=ZeroStage.NONE,
        sharding_group_size=None,
        secondary_partition_size=None,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        layer_split=None,
    )


def mean_stage_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> float:
    """The mean over stages of the relaxed layout's time per micro-batch, less its vocabulary
    collectives (module docstring): what every layout that differs from ``layout`` only in
    ``RELAXED_FIELDS`` spends at least, on average over its stages. 0 on a cluster of mixed
    device types, with a calibration or with an explicit layer split."""
    if cluster.has_mixed_devices or cluster.calibration is not None or layout.layer_split is not None:
        return 0.0
    times = stage_times(model, training, cluster, relaxed(layout), routing=routing)
    return sum(t.total_s - t.vocabulary_comm_s for t in times) / len(times)


def floor_of(training: TrainingSpec, cluster: ClusterProfile, layout: Layout, mean_s: float) -> float:
    """The step-time floor of ``layout`` from ``mean_stage_s`` (``mean_s``) of a layout it differs
    from only in ``RELAXED_FIELDS``: m mean_s, and where each rank has its own cores (no
    shared-core factor) the bubble of its own schedule over a stage of mean_s (the bubble grows
    with the slowest stage's time, which is at least the mean)."""
    return mean_s * floor_factor(training, cluster, layout)


def floor_factor(training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> float:
    """``floor_of`` over its ``mean_s``, which it is linear in: m, plus the bubble of a stage of one
    second where ranks do not share cores. It depends on the layout's ``FACTOR_FIELDS`` only (a
    search keeps one per their values)."""
    m = num_micro_batches(training.global_batch_size, layout)
    if cluster.pricing_device.core_share < 1.0:
        return float(m)
    return m + bubble_s(layout, m, 1.0, pipeline_schedules(layout, training.pipeline_flushes))


def step_time_floor_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> float:
    """Seconds below which ``layout`` does not step, nor any layout that differs from it only in
    recompute, ZeRO stage and sharding groups (module docstring); 0 where ``mean_stage_s`` is."""
    return floor_of(training, cluster, layout, mean_stage_s(model, training, cluster, layout, routing))
