"""`planner launch PLAN --run`: run this node's torchrun line in this process, through torch's own
launcher, and end the job with one line per distinct error instead of torchrun's traceback.

Under plain ``torchrun``, a clean error every rank reports (exit 2, "error: ...") is printed once per
rank and then buried under torchrun's ``ChildFailedError`` traceback, and the job exits 1. Here
each rank writes its error to the file torch's elastic agent gives it (``TORCHELASTIC_ERROR_FILE``,
``rank_errors.report``) and prints nothing; the agent hands the failures back
(``ChildFailedError.failures``) and this module prints each distinct message once, exiting with the
ranks' code (2 for a bad input, 3 for a failed job, 4 for a fault; 1 where the ranks differ).
"""

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from planner.export.torchrun import NodeCommand
from planner.flows.extras import require_torch
from planner.schemas.errors import SchemaError

QUIET_RANKS = "PLANNER_QUIET_RANK_ERRORS"
"""Set for the ranks of ``run_node``: a rank's error goes to its error file alone (printed here once)."""


@dataclass(frozen=True, slots=True)
class RankFailure:
    """How one rank of a job ended: its exit code and its one-line error ('' where it wrote none)."""

    rank: int
    exit_code: int
    message: str


def job_outcome(failures: Mapping[int, RankFailure]) -> tuple[int, list[str]]:
    """The job's exit code and its lines: each distinct error once, in rank order, "error: MSG"
    (a rank that wrote none as "rank R exited with code C"). The ranks the launcher stopped
    (killed by a signal once another rank failed) are left out where any rank exited by itself;
    the code is the common code of the ranks that did, else 1."""
    own = {rank: failure for rank, failure in failures.items() if failure.exit_code > 0}
    told = own or failures
    lines: list[str] = []
    for failure in sorted(told.values(), key=lambda f: f.rank):
        line = f"error: {failure.message or f'rank {failure.rank} exited with code {failure.exit_code}'}"
        if line not in lines:
            lines.append(line)
    codes = {failure.exit_code for failure in own.values()}
    return (codes.pop() if len(codes) == 1 else 1), lines


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _message(error_file_data: Mapping[str, object], message: str) -> str:
    """A rank's one line: what it wrote to its error file, a signal torch names, else ''."""
    written = error_file_data.get("message")
    if isinstance(written, str) and written != "<NONE>":
        return written.strip().splitlines()[0] if written.strip() else ""
    return message if message.startswith("Signal") else ""


def node_command(commands: tuple[NodeCommand, ...], node_rank: int | None, master_addr: str | None) -> NodeCommand:
    """The line launch --run runs: the only node's, or node ``node_rank``'s.

    Args:
        commands: every node's line (``planner.export.torchrun.torchrun_commands``), node 0 first.
        node_rank: which node this is; may be None on a plan of one node.
        master_addr: node 0's address, which a plan of several nodes needs (the printed lines read
            it from the shell; this process has no shell to read).

    Returns:
        The line to run.

    Raises:
        SchemaError: a plan of several nodes without --node-rank, a node it does not have, or no address.
    """
    if len(commands) == 1 and node_rank in (None, 0):
        return commands[0]
    if node_rank is None or node_rank >= len(commands):
        given = "no --node-rank" if node_rank is None else f"--node-rank {node_rank}"
        raise SchemaError(
            f"the plan runs on {len(commands)} nodes and {given} says which this is; give --node-rank 0 to "
            f"{len(commands) - 1} on each node"
        )
    command = commands[node_rank]
    if command.reads_master_addr and master_addr is None:
        raise SchemaError("--run on a plan of several nodes needs --master-addr HOST, the address of node 0")
    return command


def run_node(command: NodeCommand) -> tuple[int, list[str]]:
    """Run one node's torchrun line with torch's launcher in this process.

    Args:
        command: the line (``node_command``).

    Returns:
        The job's exit code and the lines to print (none when every rank succeeded): each distinct
        error of the ranks once (``job_outcome``).

    Raises:
        MissingExtraError: torch is not installed.
    """
    require_torch("planner launch --run")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(list(command.argv[1:]))
    agent_logs = logging.getLogger("torch.distributed.elastic")
    level = agent_logs.level
    agent_logs.setLevel(logging.CRITICAL)  # its "worker group failed" lines repeat what the ranks said
    try:
        with _environment({**dict(command.env), QUIET_RANKS: "1"}):
            run(args)  # type: ignore[no-untyped-call]
    except ChildFailedError as e:
        failures = {
            rank: RankFailure(rank, f.exitcode, _message(f.error_file_data, f.message))
            for rank, f in e.failures.items()
        }
        return job_outcome(failures)
    finally:
        agent_logs.setLevel(level)
    return 0, []
