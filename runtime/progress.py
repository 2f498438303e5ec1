"""Rank 0's progress line per step of ``planner run``: plain log lines (INFO under ``runtime``,
which the CLI prints on stderr), readable in a terminal and in a redirected log alike."""

import logging

logger = logging.getLogger(__name__)

SHORT_RUN_STEPS = 50
"""Runs of up to this many steps log every step by default; longer ones every ``LONG_RUN_EVERY``."""
LONG_RUN_EVERY = 10


def progress_every(steps: int, log_every: int | None) -> int:
    """Steps between progress lines: ``log_every`` where given (0: none), else every step of a
    short run and every ``LONG_RUN_EVERY`` of a longer one."""
    if log_every is not None:
        return log_every
    return 1 if steps <= SHORT_RUN_STEPS else LONG_RUN_EVERY


def log_step(step: int, steps: int, every: int, *, loss: float, step_time_s: float, tokens_per_step: int) -> None:
    """Log step ``step`` (0-based) of ``steps`` if it is due: every ``every`` steps, and the last."""
    done = step + 1
    if every <= 0 or (done % every != 0 and done != steps):
        return
    logger.info(
        "step %d/%d  loss %.4f  %.3f s  %.0f tokens/s",
        done,
        steps,
        loss,
        step_time_s,
        tokens_per_step / step_time_s if step_time_s > 0 else float("inf"),
    )
