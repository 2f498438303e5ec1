"""Elastic restarts (issue 18): the plan a job runs when torchrun starts it with another world
size than its plan's, searched and written without a person in the loop.

The plan's own cluster profile is cut to the ranks the job now has (``planner.survivors``: whole
nodes, or a single node's first devices), and the plan's model and training are searched again on
it (``api.replan``: the same global batch, reshaped micro-batches). Rank 0 calls this and
broadcasts the result (``runtime.elastic``), so one search runs per restart and every rank runs
the same plan. The survivors' profile and the new plan are written beside the checkpoints, as
``plans/world-N.cluster.json`` and ``plans/world-N.json``, each atomically (a temporary file
renamed over the old), so that a plan file is whole or absent and a later restart or a person
can read what ran.
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path

from planner import api
from planner.inputs import load_cluster, save_cluster
from planner.plans import check_cluster, save_plan
from planner.replanning import summary
from planner.schemas import Plan
from planner.survivors import survivors

logger = logging.getLogger(__name__)

PLANS = "plans"
"""The folder of the checkpoint directory that holds the plans of elastic restarts."""


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
    result = api.replan(plan, str(profile), checkpoint_dir=checkpoint_dir if has_checkpoint else None)
    _atomically(path, lambda tmp: save_plan(result.new, tmp))
    logger.info("re-planned for %d ranks (was %d), wrote %s", world_size, plan.cluster.world_size, path)
    for line in summary(result):
        logger.info("  %s", line)
    return api.load_plan(path), path


def _atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` to a temporary file beside ``path``, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)
