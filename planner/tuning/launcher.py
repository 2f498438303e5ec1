"""Run one plan for a few steps as its own job, and say what came of it.

Locally the job is the torchrun command ``planner launch`` prints (one node). On a cluster it is
the user's launcher template: a shell line with placeholders, e.g. for Slurm

    srun --nodes {nnodes} --ntasks-per-node 1 python -m torch.distributed.run --nnodes {nnodes}
    --nproc-per-node {nproc_per_node} --rdzv-backend c10d --rdzv-endpoint $(hostname):29500 {run_args}

A job that exits non-zero, writes no report or outlives its time limit is a failed trial with its
reason; its output stays in the trial's log file.
"""

import os
import re
import shlex
import signal
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from planner.export.torchrun import torchrun_commands
from planner.schemas import Plan, RunReport
from planner.schemas.errors import SchemaError

PLACEHOLDERS = ("plan", "report", "steps", "nnodes", "nproc_per_node", "world_size", "run_args")
"""What a launcher template may name: the plan and report paths, the steps to run, the job's shape,
and ``run_args``: ``-m planner run PLAN --steps N --report REPORT``."""

OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "Cannot allocate memory", "std::bad_alloc")


@dataclass(frozen=True, slots=True)
class TrialFiles:
    """Where one trial keeps its plan, the report its job writes, and the job's output."""

    plan: Path
    report: Path
    log: Path

    @classmethod
    def in_dir(cls, workdir: Path, key: str) -> "TrialFiles":
        """The files of the trial of plan ``key`` in ``workdir``."""
        return cls(workdir / f"plan-{key}.json", workdir / f"report-{key}.json", workdir / f"log-{key}.txt")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRun:
    """What one job of a plan came to: its report, or why there is none."""

    report: RunReport | None
    failure: str | None
    seconds: float
    log_path: Path


def check_template(template: str) -> None:
    """Refuse, before any trial runs, a template naming a placeholder we do not fill, or one that
    would not run the trial's plan and write its report (neither ``{run_args}`` nor ``{plan}`` with
    ``{report}``: its trial would measure a job that never trained)."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise SchemaError(
            f"--launcher {template!r} is not a valid template ({e}); write a literal brace as {{{{"
        ) from e
    if unknown := sorted(names - set(PLACEHOLDERS)):
        raise SchemaError(
            f"--launcher names {', '.join('{' + n + '}' for n in unknown)}; "
            f"it may use {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )
    if "run_args" not in names and not {"plan", "report"} <= names:
        raise SchemaError(
            f"--launcher {template!r} runs no plan: it names neither {{run_args}} nor both {{plan}} and {{report}}, "
            "so its trials would train nothing and report nothing; end its python line with {run_args} "
            "(-m planner run PLAN --steps N --report REPORT)"
        )


def job_command(plan: Plan, plan_path: Path, report_path: Path, steps: int, template: str | None) -> str:
    """The shell line that runs ``plan``: the template filled in, or the local torchrun command."""
    run_args = shlex.join(["-m", "planner", "run", str(plan_path), "--steps", str(steps), "--report", str(report_path)])
    if template is not None:
        ref = plan.cluster
        return template.format(
            plan=shlex.quote(str(plan_path)),
            report=shlex.quote(str(report_path)),
            steps=steps,
            nnodes=ref.num_nodes,
            nproc_per_node=ref.devices_per_node,
            world_size=ref.world_size,
            run_args=run_args,
        )
    if plan.cluster.num_nodes > 1:
        raise SchemaError(
            f"the plans span {plan.cluster.num_nodes} nodes; give --launcher, a command that starts the job on "
            "every node (e.g. an srun line; `planner tune --help` shows one)"
        )
    (command,) = torchrun_commands(plan, str(plan_path), steps=steps, report_path=str(report_path))
    env = [f"{k}={shlex.quote(v)}" for k, v in command.env]
    # The torchrun of this interpreter, whether or not its bin directory is on PATH.
    argv = [sys.executable, "-m", "torch.distributed.run", *command.argv[1:]]
    return " ".join([*env, shlex.join(argv)])


def run_job(command: str, report_path: Path, log_path: Path, timeout_s: float) -> TrialRun:
    """Run ``command`` in its own process group; stop the whole group after ``timeout_s``."""
    report_path.unlink(missing_ok=True)
    start = time.perf_counter()
    with log_path.open("w") as log:
        log.write(f"$ {command}\n")
        log.flush()
        proc = subprocess.Popen(
            ["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd()
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            return TrialRun(
                report=None,
                failure=f"timed out after {timeout_s:g} s (raise --trial-timeout if the plan is just slow)",
                seconds=time.perf_counter() - start,
                log_path=log_path,
            )
    seconds = time.perf_counter() - start
    tail = log_path.read_text(errors="replace").splitlines()[1:][-200:]  # the job's output, not its command
    if code != 0:
        return TrialRun(report=None, failure=_reason(code, tail), seconds=seconds, log_path=log_path)
    if not report_path.exists():
        return TrialRun(
            report=None, failure="the job succeeded but wrote no report", seconds=seconds, log_path=log_path
        )
    report = RunReport.model_validate_json(report_path.read_text())
    return TrialRun(report=report, failure=None, seconds=seconds, log_path=log_path)


def _stop_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")
"""A Python exception's last line, as a rank prints it (torchrun prefixes '[rankN]: ')."""


def _reason(code: int, tail: list[str]) -> str:
    """One line: out of memory, the first exception a rank raised, or the exit code and last line."""
    if any(marker in line for line in tail for marker in OOM_MARKERS):
        line = next(line for line in tail if any(marker in line for marker in OOM_MARKERS))
        return f"out of memory: {line.strip()[:300]}"
    exceptions = [m.group(1) for line in tail if (m := EXCEPTION_LINE.match(line.strip()))]
    if exceptions:
        return f"exit code {code}: {exceptions[0].strip()[:300]}"
    last = ([line for line in tail if line.strip()] or ["(no output)"])[-1]
    return f"exit code {code}: {last.strip()[:300]}"
