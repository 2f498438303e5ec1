"""`planner run`: train with a plan on every rank under torchrun, or trace one rank's step
under fake tensors (a dry run) before renting the cluster."""

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from planner.files.plans import load_plan, plan_cluster
from planner.flows.extras import require_torch
from planner.schemas import Plan, RunReport
from planner.schemas.errors import SchemaError
from planner.schemas.settings import OptimizerName, RunSettings

if TYPE_CHECKING:  # the modules behind these import torch: loaded on use
    from runtime.dry_run import DryRunResult


def run(settings: RunSettings) -> RunReport | None:
    """Train with ``settings.plan`` for a few steps; call it on every rank under torchrun.

    Args:
        settings: the plan (loaded once, with its file's hash) and how to run it (``RunSettings``).

    Returns:
        On rank 0 the RunReport (measured step times, per-rank peak memory, losses beside the
        plan's predictions); None on the other ranks.

    Raises:
        MissingExtraError: torch is not installed.
        SchemaError: not under torchrun (RANK unset).
        InfeasibleConfigError: the plan is for another world size (unless elastic) or device, or
            (elastic) no layout fits the job's ranks.
        JobFailed: a rank died, hung past ``timeout_s`` or was stopped; the message names the
            ranks that stopped responding and where they last were (every surviving rank raises it).
        StragglerFound: under ``OnFault.EXIT``, a rank was far slower than its peers; the message
            names it and its host (every rank raises it; rank 0 has written the report).
    """
    require_torch("planner run")  # first: without torch there is no torchrun either
    if "RANK" not in os.environ:
        plan = settings.plan_file or "PLAN.json"
        raise SchemaError(f"planner run runs on every rank under torchrun: `planner launch {plan}` prints the command")
    from planner.flows.replan import plan_for_world
    from runtime.run import run as run_plan

    replan = None
    if settings.elastic:
        assert settings.checkpoint_dir is not None
        replan = functools.partial(plan_for_world, settings.plan, checkpoint_dir=settings.checkpoint_dir)
    return run_plan(settings, replan=replan)


def check_resumable(settings: RunSettings) -> None:
    """Refuse, before any rank starts, a run whose ``--resume`` every rank would refuse: no
    complete checkpoint in ``settings.checkpoint_dir``, one of another model or global batch, or
    one that has done ``settings.steps`` already (``planner launch --run`` checks it once, the
    ranks check it again).

    Args:
        settings: the run's settings (only ``resume``, ``checkpoint_dir`` and ``steps`` are read,
            with the plan's model and global batch).

    Returns:
        Nothing: the run starts afresh, or its checkpoint can be resumed.

    Raises:
        MissingExtraError: torch is not installed.
        SchemaError: no complete checkpoint there.
        InfeasibleConfigError: the checkpoint is another model's or global batch's, or has no
            steps left to run.
    """
    if not settings.resume:
        return
    require_torch("planner launch --run --resume")  # the runtime package imports torch
    from runtime.checkpoint_meta import check_loadable, check_steps_left

    assert settings.checkpoint_dir is not None  # RunSettings refuses --resume without it
    meta = check_loadable(settings.checkpoint_dir, settings.plan.model, settings.plan.training.global_batch_size)
    check_steps_left(int(meta["step"]), settings.steps)


def dry_run(
    plan: Plan | str | Path, rank: int = 0, *, optimizer: OptimizerName = OptimizerName.ADAMW
) -> "DryRunResult":
    """Trace one rank's training step under fake tensors and a fake process group (no devices,
    no torchrun): its peak memory beside the plan's estimate, before renting the cluster.

    A process can set up the fake process group once: trace each further rank in a fresh process.

    Args:
        plan: a Plan or a plan file.
        rank: the rank of the plan's world to trace.
        optimizer: as ``RunSettings.optimizer``.

    Returns:
        The rank's traced peak bytes (by category), the estimate's bytes for its stage, and seconds taken.

    Raises:
        MissingExtraError: torch is not installed.
        InfeasibleConfigError: ``rank`` is outside the plan's world, the plan recomputes modules
            the runtime does not checkpoint (``schemas.runtime_support.check_recompute_modules``), or
            the runtime does not build its model (``schemas.runtime_support.check_buildable``).
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)  # a bad plan is refused before torch is imported
    plan_cluster(loaded, required=False)  # its profile, where found, must be the plan's
    require_torch("planner run --dry-run")
    from runtime.dry_run import dry_run as trace

    return trace(loaded, rank, optimizer=str(optimizer))
