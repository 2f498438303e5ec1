"""`planner launch --run`: run this node's torchrun line in this process, through torch's own
launcher (``torch.distributed.run``), and end the job with one line instead of torchrun's
traceback.

The line is the one `planner launch` prints (``planner.export.torchrun``), parsed by torchrun's
own argument parser, so the printed and the run form never differ. The ranks report a user error
to their torchrun error file and say nothing themselves (``planner.flows.rank_errors``); when the
agent reports failed ranks, ``rank_errors.outcome_of`` makes the lines and the exit code of them.
"""

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from planner.export.torchrun import NodeCommand
from planner.flows.extras import require_torch
from planner.flows.rank_errors import QUIET_ENV, NodeOutcome, RankFailure, outcome_of
from planner.schemas import DeviceKind, Plan
from planner.schemas.errors import InfeasibleConfigError

TORCH_LAUNCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")
"""torchrun's agent logs each failure, each rank it stops and its own traceback here: the outcome
says what of it matters, once."""
INTERRUPTED_EXIT = 128 + signal.SIGINT
"""The shell's code for a job stopped by Ctrl-C."""


def check_devices(plan: Plan) -> None:
    """Refuse a plan for CUDA devices on a node without as many as the plan gives it: every rank
    would refuse it after starting (``runtime.run.check_world``).

    Args:
        plan: the plan launch --run is about to run on this node.

    Returns:
        Nothing: the node has the devices (or the plan runs on CPU ranks).

    Raises:
        MissingExtraError: torch is not installed.
        InfeasibleConfigError: naming the devices the plan needs and those the node has.
    """
    if plan.cluster.device_kind is DeviceKind.CPU:
        return
    require_torch("planner launch --run")
    import torch

    have, need = torch.cuda.device_count(), plan.cluster.devices_per_node
    if have < need:
        raise InfeasibleConfigError(
            f"the plan runs {need} {plan.cluster.device_name!r} devices a node, but this node has {have} CUDA "
            "device(s); run it where those devices are, or plan for this machine (planner profile, then planner search)"
        )


@contextmanager
def _quiet_launcher(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the ranks to inherit, and torchrun's agent's logging muted, for the
    duration; both restored after (the launcher may run inside a longer-lived process)."""
    saved_env = {name: os.environ.get(name) for name in env}
    loggers = [logging.getLogger(name) for name in TORCH_LAUNCH_LOGGERS]
    saved = [(lg.propagate, lg.handlers[:]) for lg in loggers]
    null = logging.NullHandler()  # with propagation off and no handler, logging's last resort would print
    for lg in loggers:
        lg.propagate = False
        lg.handlers = [null]
    os.environ.update(env)
    try:
        yield
    finally:
        for lg, (propagate, handlers) in zip(loggers, saved, strict=True):
            lg.propagate, lg.handlers = propagate, handlers
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def launch_node(command: NodeCommand) -> NodeOutcome:
    """Run ``command`` (a line of ``torchrun_commands``) through torch's launcher in this process.

    Args:
        command: this node's line, as ``planner launch`` prints it.

    Returns:
        Exit code 0 when every rank finished; 2 and the ranks' user error once when each failed
        rank stopped on one; 1 and a line per distinct failure otherwise; 130 on Ctrl-C.

    Raises:
        MissingExtraError: torch is not installed.
    """
    require_torch("planner launch --run")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    assert command.argv[0] == "torchrun" and not command.reads_master_addr, command.argv
    args = torchrun.parse_args(list(command.argv[1:]))  # type: ignore[no-untyped-call]
    try:
        with _quiet_launcher({**dict(command.env), QUIET_ENV: "1"}):
            torchrun.run(args)  # type: ignore[no-untyped-call]
    except ChildFailedError as e:
        failures = [
            RankFailure(
                rank=rank,
                exit_code=f.exitcode,
                message=_message(f.message) if os.path.isfile(f.error_file) else "",  # else torch's filler
            )
            for rank, f in e.failures.items()
        ]
        return outcome_of(failures)
    except SignalException as e:
        return NodeOutcome(exit_code=128 + int(e.sigval))
    except KeyboardInterrupt:
        return NodeOutcome(exit_code=INTERRUPTED_EXIT)
    return NodeOutcome(exit_code=0)


def _message(message: object) -> str:
    """A failure's message: torch's ``@record`` writes a dict holding it, our ranks the string."""
    if isinstance(message, dict):
        return str(message.get("message", ""))
    return str(message)
