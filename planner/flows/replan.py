"""`planner replan`, and the plan of an elastic restart: a plan's model and training searched again
for other devices, and what changed.

The global batch stays whole: the new layout's micro-batches are reshaped to it (B = d b m with
the new d, b and m), and the runtime divides each micro-batch's loss by m and averages the
gradients over the d replicas, so every step still takes the gradient of the global batch's mean
loss, as ElasWave (Wu et al. 2025) keeps the gradient scale when it reshapes micro-batches after
a failure. A checkpoint of the old plan then loads into the new layout (``runtime.checkpoint``).

An elastic restart (torchrun starting the job with another world size than its plan's) needs no
person: the plan's own cluster profile is cut to the ranks the job now has (``survivors``: whole
nodes, since torchrun's elastic agents join and leave a node at a time, or a single node's first
devices; the kept part's links, node overrides and collective curves are the measured ones, and
curves of groups larger than the new world are dropped), and the plan is searched again on it.
Rank 0 calls ``plan_for_world`` and broadcasts the result (``runtime.elastic``), so one search
runs per restart and every rank runs the same plan. The survivors' profile and the new plan are
written beside the checkpoints, as ``plans/world-N.cluster.json`` and ``plans/world-N.json``,
each atomically (a temporary file renamed over the old), so that a plan file is whole or absent
and a later restart or a person can read what ran.
"""

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.files.clusters import load_cluster, save_cluster
from planner.files.plans import check_cluster, load_plan, save_plan
from planner.flows.extras import require_torch
from planner.flows.search import search
from planner.schemas import ClusterProfile, DeviceKind, Layout, Plan
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import num_micro_batches
from planner.schemas.links import LinkMatrix
from planner.schemas.runtime_support import check_runnable
from planner.schemas.settings import ReplanSettings
from planner.search_engine.strategy import Progress

logger = logging.getLogger(__name__)

PLANS = "plans"
"""The folder of the checkpoint directory that holds the plans of elastic restarts."""

COMPARED: tuple[tuple[str, str], ...] = (
    ("data_parallel_degree", "dp"),
    ("tensor_parallel_degree", "tp"),
    ("pipeline_parallel_degree", "pp"),
    ("context_parallel_degree", "cp"),
    ("expert_parallel_degree", "ep"),
    ("micro_batch_size", "micro-batch size"),
    ("zero_stage", "ZeRO stage"),
    ("sequence_parallel", "sequence parallel"),
    ("recompute", "recompute"),
    ("recompute_modules", "recompute modules"),
    ("schedule", "schedule"),
    ("virtual_stages", "virtual stages"),
    ("vocabulary_layout", "vocabulary layout"),
)
"""The layout fields a re-plan reports when they change, with their names in the report."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Replan:
    """A plan searched again for other devices, beside the plan it replaces."""

    old: Plan
    new: Plan
    checkpoint_step: int | None = None
    """The steps done in the checkpoint found loadable by the new plan; None: none was checked."""

    @property
    def throughput_loss(self) -> float:
        """The predicted tokens/s lost, as a share of the old plan's (negative: a gain)."""
        return 1.0 - self.new.estimate.tokens_per_s / self.old.estimate.tokens_per_s

    def summary(self) -> tuple[str, ...]:
        """The re-plan's report, one line each: devices, the layout's changes, the predicted step time
        and throughput, and what a resumed run keeps."""
        old, new = self.old, self.new
        batch = old.training.global_batch_size
        lines = [
            f"devices: {old.cluster.world_size} ({old.cluster.spec}) -> {new.cluster.world_size} ({new.cluster.spec})",
            f"layout: {old.layout.describe()} -> {new.layout.describe()}",
            *("  " + line for line in layout_changes(old.layout, new.layout, batch) or ("no change",)),
            f"predicted step time: {old.estimate.step_time_s:.4g} s -> {new.estimate.step_time_s:.4g} s",
            f"predicted tokens/s: {old.estimate.tokens_per_s:,.0f} -> {new.estimate.tokens_per_s:,.0f} "
            f"(throughput {'loss' if self.throughput_loss >= 0 else 'gain'} {abs(self.throughput_loss):.1%})",
            f"kept: model {old.model.name}, global batch {batch} x {old.training.seq_len} tokens "
            "(the gradient of the whole batch's mean loss each step)",
        ]
        if self.checkpoint_step is not None:
            lines.append(f"checkpoint: step {self.checkpoint_step} loads into the new layout (resharded)")
        return tuple(lines)


def layout_changes(old: Layout, new: Layout, global_batch_size: int) -> tuple[str, ...]:
    """What differs between two layouts of one global batch: ``name: old -> new`` for each field
    of ``COMPARED`` that changed, and the micro-batches per step when their count changed."""
    lines = [
        f"{label}: {_shown(getattr(old, name))} -> {_shown(getattr(new, name))}"
        for name, label in COMPARED
        if getattr(old, name) != getattr(new, name)
    ]
    before, after = num_micro_batches(global_batch_size, old), num_micro_batches(global_batch_size, new)
    if before != after:
        lines.append(f"micro-batches per step and replica: {before} -> {after}")
    return tuple(lines)


def _shown(value: object) -> str:
    """A layout field's value as the report shows it (enums by value)."""
    return str(getattr(value, "value", value))


def replan(
    plan: Plan | str | Path,
    cluster: ClusterProfile | str,
    settings: ReplanSettings = ReplanSettings(),
    *,
    progress: Progress | None = None,
) -> Replan:
    """Search ``plan``'s model and training again on ``cluster`` (the devices left after a
    failure, or more), for a layout the runtime runs and a checkpoint of the old plan loads into.

    The global batch, sequence length and precision stay: the micro-batches are reshaped to the
    new data-parallel degree.

    Args:
        plan: the plan (or its file) that ran.
        cluster: the new devices: a preset NAME:NODES or a profile (file).
        settings: the checkpoint to check and the search (``ReplanSettings``).
        progress: called as progress(done, total) while searching.
        progress: called as progress(done, total) while searching.

    Returns:
        The old plan, the new one and the checkpoint's step, for ``summary``.

    Raises:
        MissingExtraError: a checkpoint to check, and torch is not installed.
        SchemaError: an input could not be read, or no complete checkpoint is in the checkpoint folder.
        InfeasibleConfigError: no layout fits or none of the fastest runs on this runtime, or the
            checkpoint cannot load into the new plan.
    """
    old = plan if isinstance(plan, Plan) else load_plan(plan)
    step = None
    if settings.checkpoint_dir is not None:  # before the search: the new plan keeps the model and global batch
        require_torch("planner replan --checkpoint-dir")  # the runtime package imports torch
        from runtime.checkpoint_meta import check_loadable

        checkpoint = check_loadable(
            settings.checkpoint_dir,
            old.model,
            old.training.global_batch_size,
            otherwise="give the folder the old run's --checkpoint-dir named, or leave out --checkpoint-dir",
        )
        step = int(checkpoint["step"])
    training = old.training if settings.stack is None else old.training.under(settings.stack)
    plans = search(old.model, cluster, training, settings.search, progress=progress)
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
    first devices of its node otherwise, whose CPU ranks then share its cores among fewer
    (``survivor_core_share``; see the module's docstring).

    Args:
        cluster: the measured (or preset) cluster profile.
        world_size: the ranks to keep.

    Returns:
        The kept part's profile, named ``<name>-first-<world_size>``; ``cluster`` itself when it
        keeps every rank.

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
        share = survivor_core_share(cluster.device.core_share, per_node, world_size)
        return ClusterProfile.model_validate(
            {
                **dict(cluster),
                "name": name,
                "device": cluster.device.model_copy(update={"core_share": share}),
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


def survivor_core_share(core_share: float, ranks: int, kept: int) -> float:
    """The share of a core each of ``kept`` ranks gets on a node where ``ranks`` ranks had
    ``core_share`` each, as the runtime gives it (``runtime.threads.core_share``). Below 1 the
    ranks outnumbered the cores and ran a thread each, so the node has ``core_share * ranks``
    cores; fewer ranks share them less. The profile's times stay those measured at the old share,
    so a cut that frees cores is priced no faster than measured, except while other ranks wait.

    Args:
        core_share: the profiled share, in (0, 1].
        ranks: ranks on the node when profiled.
        kept: ranks left on it.

    Returns:
        The share of a core each kept rank gets, in (0, 1].
    """
    if core_share >= 1.0:
        return core_share
    return min(1.0, core_share * ranks / kept)


def plan_path(checkpoint_dir: Path, world_size: int) -> Path:
    """Where the plan for a world of ``world_size`` ranks is written."""
    return checkpoint_dir / PLANS / f"world-{world_size}.json"


def plan_for_world(plan: Plan, world_size: int, checkpoint_dir: Path) -> tuple[Plan, Path]:
    """Search ``plan``'s model and training again for the first ``world_size`` ranks of its
    cluster, write the survivors' profile and the new plan under ``checkpoint_dir``/plans, and
    log what changed and the predicted throughput lost.

    Args:
        plan: the plan the job was launched with (always the original: a second restart cuts
            the original cluster again, not the first restart's).
        world_size: the ranks the job has now.
        checkpoint_dir: the run's checkpoint folder; its newest complete checkpoint, if any, must
            load into the new plan.

    Returns:
        The new plan and the file it was written to.

    Raises:
        SchemaError: the plan's cluster profile cannot be read.
        InfeasibleConfigError: ``world_size`` is not a whole part of the cluster, no layout of the
            model and global batch fits on it, or the checkpoint cannot load into it.
    """
    cluster = load_cluster(plan.cluster.spec)
    check_cluster(plan, cluster)
    path = plan_path(checkpoint_dir, world_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = path.with_suffix(".cluster.json")
    _atomically(profile, lambda tmp: save_cluster(survivors(cluster, world_size), tmp))
    has_checkpoint = (checkpoint_dir / "latest").is_file()  # runtime.checkpoint_meta.LATEST
    result = replan(plan, str(profile), ReplanSettings(checkpoint_dir=checkpoint_dir if has_checkpoint else None))
    _atomically(path, lambda tmp: save_plan(result.new, tmp))
    logger.info("re-planned for %d ranks (was %d), wrote %s", world_size, plan.cluster.world_size, path)
    for line in result.summary():
        logger.info("  %s", line)
    return load_plan(path), path


def _atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` to a temporary file beside ``path``, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)
