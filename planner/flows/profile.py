"""`planner profile`: measure the cluster this job runs on, on every rank under torchrun."""

import json
import logging
import os
from dataclasses import replace

from cost_models.layer_work import profile_gemm_shapes
from planner.files.clusters import save_cluster
from planner.flows.extras import require_torch
from planner.schemas.settings import ProfileSettings

logger = logging.getLogger(__name__)


def profile(settings: ProfileSettings = ProfileSettings()) -> int:
    """Measure the cluster this job runs on; call it on every rank under torchrun.

    With a model, its own GEMM shapes are timed too, as the cost model sees them at the job's world
    size (``cost_models.layer_work.profile_gemm_shapes``).

    Args:
        settings: what to measure and where rank 0 writes it (``ProfileSettings``).

    Returns:
        0 when every phase was measured; profiler.run.FAILED_EXIT_CODE (3) when a rank failed,
        in which case rank 0 wrote what it measured, marked incomplete, and the culprit is logged.
        Rank 0 writes ``settings.output`` either way.

    Raises:
        MissingExtraError: torch is not installed.
        ProfileError: not under torchrun.
    """
    require_torch("planner profile")
    from profiler.run import profile as run_profile  # torch: only for the commands that need it

    if settings.model is not None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        shapes = profile_gemm_shapes(settings.model, settings.seq_len, world_size)
        settings = replace(settings, model_gemm_shapes=shapes)
    outcome = run_profile(settings.quickened())
    if outcome.profile is not None:
        save_cluster(outcome.profile, settings.output)
        logger.info("wrote %s", settings.output)
        for what in outcome.profile.provenance.not_measured:
            logger.warning("not measured: %s", what)
    elif outcome.incomplete is not None:
        settings.output.write_text(json.dumps(outcome.incomplete, indent=2) + "\n")
        logger.warning("wrote the incomplete profile to %s", settings.output)
    return outcome.exit_code
