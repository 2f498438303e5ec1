"""An elastic start (``planner run --elastic``): when torchrun starts the job, or restarts it
after a failure, with a world size other than the plan's, the ranks agree on a plan for the
ranks they are.

Rank 0 searches (the ``replan`` callback: ``planner.flows.replan.plan_for_world``) and broadcasts the
new plan, or the one-line reason none fits, over the process group; the other ranks wait for it.
One search per restart, not one per rank (they would share the machine's cores), and every rank
runs exactly the plan rank 0 wrote, whatever ties the search may break.
"""

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from planner.schemas import Plan
from planner.schemas.errors import InfeasibleConfigError, PlannerError

logger = logging.getLogger(__name__)

Replan = Callable[[int], tuple[Plan, Path]]
"""The plan for a world of so many ranks and the file it was written to."""


def agreed_plan(replan: Replan, rank: int, world_size: int) -> tuple[Plan, Path, str]:
    """The plan for this job's ``world_size`` ranks, the same on every rank: rank 0 calls
    ``replan``, the others receive its result (call it on every rank, after the process group
    is up).

    Returns:
        The plan, its file and the SHA-256 of the file's bytes (what a RunReport and a
        checkpoint record).

    Raises:
        PlannerError: on rank 0, what ``replan`` raised; on the others, an
            InfeasibleConfigError with its message (every rank then exits with code 2).
    """
    sent: list[object] = [None]
    error: PlannerError | None = None
    if rank == 0:
        try:
            plan, path = replan(world_size)
            sent[0] = ("plan", plan, str(path), hashlib.sha256(path.read_bytes()).hexdigest())
        except PlannerError as e:
            error = e
            sent[0] = ("error", str(e))
    dist.broadcast_object_list(sent, src=0)
    received = sent[0]
    assert isinstance(received, tuple)
    if received[0] == "error":
        if error is not None:
            raise error
        raise InfeasibleConfigError(str(received[1]))
    _, plan, path, sha256 = received
    assert isinstance(plan, Plan)
    return plan, Path(path), str(sha256)
