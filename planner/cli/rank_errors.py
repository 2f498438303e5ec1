"""How a command says its one-line error: on stderr, and under torch's elastic agent also in the
rank's error file (``TORCHELASTIC_ERROR_FILE``), where torchrun's summary and ``planner launch
--run`` read it. Under ``launch --run`` the ranks print nothing themselves: it prints each distinct
error once for the whole job (``flows.launch_run``)."""

import json
import os
import time

import typer

from planner.flows.launch_run import QUIET_RANKS


def report_error(message: str) -> None:
    """Say ``message`` as the command's error: "error: MESSAGE" on stderr (unless the ranks are
    quiet), and in this rank's error file where torch's elastic agent gave one."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            with open(error_file, "w") as file:
                json.dump({"message": message, "timestamp": int(time.time())}, file)
        except OSError:
            pass  # the error is still printed below, as without an agent
    if not (error_file and os.environ.get(QUIET_RANKS)):
        typer.echo(f"error: {message}", err=True)
