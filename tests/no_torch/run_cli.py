"""Runs several ``planner`` command lines in one interpreter, each through the console script's
``main``, and writes each one's exit code and stderr to a JSON file: one start-up (about 1.5 s of
imports) instead of one per command.

Usage: python run_cli.py RESULTS.json ARGV_JSON [ARGV_JSON ...], each ARGV_JSON a JSON list of
the arguments after ``planner``. Any exception but SystemExit escapes with its traceback (a bug).
"""

import contextlib
import io
import json
import sys
from pathlib import Path

from planner.cli import main


def run(argv: list[str]) -> dict[str, object]:
    """Run ``planner argv``: its arguments, exit code and stderr."""
    sys.argv = ["planner", *argv]
    stderr = io.StringIO()
    code: object = 0
    with contextlib.redirect_stderr(stderr):
        try:
            main()
        except SystemExit as e:
            code = 0 if e.code is None else e.code
    return {"argv": argv, "code": code, "stderr": stderr.getvalue()}


if __name__ == "__main__":
    output, *argvs = sys.argv[1:]  # before run() replaces sys.argv
    Path(output).write_text(json.dumps([run(json.loads(argv)) for argv in argvs], indent=1))
