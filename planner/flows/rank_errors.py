"""How a rank's error reaches `planner launch --run` (``planner.flows.launch``), and how the
launcher turns its ranks' failures into what it prints: one line and exit code 2 when every rank
that failed stopped on a user error, one line per distinct failure and exit code 1 otherwise.

Under torchrun every rank has an error file (TORCHELASTIC_ERROR_FILE), which torchrun's agent
reads into each failure's message. A rank writes its error there, as torch's own ``@record``
would (this module needs no torch: the CLI that imports it must not load it); under
``launch --run`` (``QUIET_ENV`` set) it then prints nothing itself, so the launcher says the
error once for all ranks instead of once per rank. Under a torchrun started by hand, every rank
still prints its line as before.
"""

import json
import os
import re
import signal
import time
from dataclasses import dataclass

QUIET_ENV = "PLANNER_RANK_ERRORS_TO_LAUNCHER"
"""Set to 1 by `planner launch --run` for its ranks: a rank's error goes to its error file only."""
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun's agent reads a rank's error from (one file per rank)."""
USER_ERROR_EXIT = 2
"""A rank's exit code for a PlannerError (``PlannerError.exit_code``): the user's to fix."""
_RANK_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s*)+")
_ERROR_PREFIX = "error: "


def report_to_launcher(message: str) -> bool:
    """Write ``message`` to this rank's torchrun error file, when there is one.

    Returns:
        Whether the launcher prints it (``planner launch --run``), so that the rank must not.
    """
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    try:
        with open(path, "w") as file:
            json.dump({"message": message, "timestamp": int(time.time())}, file)
    except OSError:  # the rank then says it itself: an error must not vanish
        return False
    return os.environ.get(QUIET_ENV) == "1"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFailure:
    """One failed rank as torchrun's agent saw it."""

    rank: int
    exit_code: int
    """The process's exit code; minus the signal's number when a signal ended it."""
    message: str
    """What the rank wrote to its error file (a dict's inner message), or empty."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOutcome:
    """What `planner launch --run` prints on stderr and the code it exits with."""

    exit_code: int
    lines: tuple[str, ...] = ()


def _clean(message: str) -> str:
    """The message's last non-empty line, without torch's ``[rankN]:`` prefixes and our ``error: ``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    last = _RANK_PREFIX.sub("", lines[-1]) if lines else ""
    return last.removeprefix(_ERROR_PREFIX).strip()


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)


def outcome_of(failures: list[RankFailure]) -> NodeOutcome:
    """The launcher's verdict on its ranks' failures (at least one).

    The ranks torchrun's agent stopped with SIGTERM once another had failed are no failures of
    their own and are left out (unless nothing else failed). If every remaining rank exited with
    ``USER_ERROR_EXIT``, their messages, deduplicated, are the lines (one, as a rule: ranks that
    checked the same thing raise the same error); otherwise one line per distinct (exit code,
    message), naming the ranks.
    """
    own = [f for f in failures if f.exit_code != -signal.SIGTERM] or failures
    own.sort(key=lambda f: f.rank)
    if all(f.exit_code == USER_ERROR_EXIT for f in own):
        said = dict.fromkeys(_clean(f.message) or f"{_ranks([f.rank])} exited with code 2" for f in own)
        return NodeOutcome(exit_code=USER_ERROR_EXIT, lines=tuple(f"error: {m}" for m in said))
    grouped: dict[tuple[int, str], list[int]] = {}
    for f in own:
        grouped.setdefault((f.exit_code, _clean(f.message)), []).append(f.rank)
    lines = []
    for (code, message), ranks in grouped.items():
        how = f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"exit code {code}"
        lines.append(f"{_ranks(ranks)} failed: {how}" + (f": {message}" if message else ""))
    return NodeOutcome(exit_code=1, lines=tuple(lines))
