"""Rank 0's progress through a profiling run: n of N and elapsed per phase; redirected, a few
plain lines; on a terminal, a live line per phase; other ranks silent."""

import io

import pytest

from profiler import progress as progress_module
from profiler.progress import ProfileProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(progress: ProfileProgress) -> None:
    progress.begin("links")
    progress.expect("links", 4)
    for i in range(4):
        progress.step("links", f"round {i + 1}")
    progress.end(1.25)
    progress.begin("ops")
    progress.step("ops", "gemm 1/2 64x64x64 bf16")
    progress.end(3.0)
    progress.close()


def test_redirected_one_plain_line_per_phase() -> None:
    out = io.StringIO()
    _run(ProfileProgress(True, out))
    assert out.getvalue().splitlines() == [
        "profile [2/4] links: 4 measured in 1.2 s",
        "profile [4/4] ops: 1 measured in 3.0 s",
    ]


def test_redirected_a_long_phase_says_where_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 5.0, 20.0, 21.0, 22.0, 40.0, 41.0])
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    progress = ProfileProgress(True, out)
    progress.begin("ops")  # 0 s
    progress.step("ops", "attention")  # 5 s: quiet enough
    progress.step("ops", "layernorm")  # 20 s: a line (then 21.0 is its time)
    progress.step("ops", "optimizer")  # 22 s: too soon after it
    progress.step("ops", "pipeline slot")  # 40 s: a line
    assert out.getvalue().splitlines() == [
        "profile [4/4] ops: step 2 layernorm (20 s)",
        "profile [4/4] ops: step 4 pipeline slot (40 s)",
    ]


def test_on_a_terminal_a_line_per_phase_with_n_of_n() -> None:
    out = _Terminal()
    _run(ProfileProgress(True, out))
    text = out.getvalue()
    assert "[2/4] links: 4 measured in 1.2 s" in text and "[4/4] ops: 1 measured in 3.0 s" in text
    assert "0:00:0" in text and "✓" in text  # elapsed; finished phases ticked


def test_other_ranks_say_nothing() -> None:
    for stream in (io.StringIO(), _Terminal()):
        _run(ProfileProgress(False, stream))
        assert stream.getvalue() == ""
