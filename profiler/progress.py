"""Rank 0's progress through a profiling run, on stderr: what is being measured, n of N, elapsed.

On a terminal a live line per phase (rich), each finished phase kept as one line; redirected to a
file or a pipe, plain lines: the step under way when a phase has gone ``QUIET_S`` without one,
and one per finished phase (a log stays short, and never a minute without a line).
Other ranks say nothing.
"""

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

PHASES = ("topology", "links", "collectives", "ops")
"""The profiling phases, in the order they run."""
QUIET_S = 15.0
"""Redirected, the longest a phase goes without a line."""


class ProfileProgress:
    """Told of each phase's start and end and of every step (``Context.at``), it shows them."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        console = Console(file=self.stream)
        self.bar = (
            Progress(
                SpinnerColumn(finished_text="✓"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
            )
            if enabled and console.is_terminal
            else None
        )
        self.task: TaskID | None = None
        self.phase = ""
        self.steps = 0
        self.expected: int | None = None
        self.started = self.last_line = 0.0
        if self.bar is not None:
            self.bar.start()

    def begin(self, phase: str) -> None:
        """``phase`` starts."""
        self.phase, self.steps, self.expected = phase, 0, None
        self.started = self.last_line = time.perf_counter()
        if self.bar is not None:
            self.task = self.bar.add_task(self._line(""))

    def expect(self, phase: str, steps: int) -> None:
        """``phase`` will take ``steps`` steps."""
        if phase == self.phase:
            self.expected = steps

    def step(self, phase: str, what: str) -> None:
        """A step of ``phase`` starts, measuring ``what``."""
        if phase != self.phase:
            return
        self.steps += 1
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, description=self._line(what))
        elif self.enabled and (now := time.perf_counter()) - self.last_line >= QUIET_S:
            self._print(f"{self._line(what)} ({now - self.started:.0f} s)")

    def end(self, seconds: float) -> None:
        """The current phase is done, after ``seconds``."""
        done = f"{self._index()} {self.phase}: {self.steps} measured in {seconds:.1f} s"
        if self.bar is not None and self.task is not None:
            finished = max(self.steps, 1)  # a finished task: its spinner becomes a tick, its clock stops
            self.bar.update(self.task, description=done, total=finished, completed=finished)
        elif self.enabled:
            self._print(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _print(self, line: str) -> None:
        self.stream.write(f"profile {line}\n")
        self.stream.flush()
        self.last_line = time.perf_counter()

    def _index(self) -> str:
        return f"[{PHASES.index(self.phase) + 1}/{len(PHASES)}]" if self.phase in PHASES else ""

    def _line(self, what: str) -> str:
        count = f"{self.steps}/{self.expected}" if self.expected else f"step {self.steps}"
        detail = f" {count}" + (f" {what}" if what else "") if self.steps else " ..."
        return f"{self._index()} {self.phase}:{detail}"
