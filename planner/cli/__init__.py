"""The ``planner`` command line: a thin layer over ``planner.api``.

Each command parses its options into a Settings object, calls a flow through the API, renders the
result through ``planner.views`` and writes its artifact; none holds logic of its own. The
commands that plan are in ``plan_commands``, those over a plan file in ``plan_file_commands``,
those that run on a cluster in ``cluster_commands``, replan in ``replan_command``, and the cluster
profile's own (``planner cluster cut``) in ``cluster_profile_commands``. A PlannerError
(bad input, infeasible layout) prints one line and exits with code 2; any other exception is a bug
and keeps its traceback.
"""

import logging
import sys

import typer

from planner.cli.cluster_commands import profile, run, tune, validate
from planner.cli.cluster_profile_commands import cluster_app
from planner.cli.options import say_error
from planner.cli.plan_commands import estimate, search
from planner.cli.plan_file_commands import explain, export, launch, presets, stacks
from planner.cli.replan_command import replan
from planner.flows.rank_errors import report_to_launcher
from planner.schemas.errors import PlannerError
from planner.search_engine.optuna_import import set_optuna_verbosity

__all__ = ["app", "main"]

app = typer.Typer(
    help="Plan how to split an LLM's training over a cluster: predict memory and step time of layouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[default: 1]" is text, not rich markup to strip
)
for _command in (estimate, search, replan, explain, launch, export, profile, run, tune, validate, presets, stacks):
    app.command()(_command)
app.add_typer(cluster_app, name="cluster")


class _LogFormatter(logging.Formatter):
    """Information as the bare message (as the CLI's own lines); warnings and errors with their level."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno <= logging.INFO else f"{record.levelname}: {message}"


def _configure_logging() -> None:
    """Our packages' information and every warning on stderr (the library logs, never prints)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_LogFormatter("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    for package in ("planner", "profiler", "runtime"):
        logging.getLogger(package).setLevel(logging.INFO)
    set_optuna_verbosity(logging.WARNING)


def main() -> None:
    """Console-script entry point: PlannerError exits 2 (a failed job 3) with one line; usage errors exit 2
    through typer; nothing else is caught."""
    _configure_logging()
    try:
        app()
    except PlannerError as e:
        say_error(e)
        sys.exit(e.exit_code)
    except Exception as e:  # a bug: it keeps its traceback; under torchrun its last line also reaches the launcher
        report_to_launcher(f"{type(e).__name__}: {e}")
        raise
