"""`planner run` says how each step went (rank 0, plain log lines on stderr) and, with --keep-last N,
keeps the newest N complete checkpoints and the one it resumed from: pruning alone (no torch),
then one torchrun job of 2 CPU ranks and its resumption."""

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_cluster
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster
from runtime import checkpoint
from runtime.checkpoint_meta import META, latest, prune
from runtime.progress import log_step, progress_every

STEP_LINE = re.compile(r"^step (\d+)/(\d+)  loss \d+\.\d{4}  \d+\.\d{3} s  \d+ tokens/s$", re.MULTILINE)


def _complete(directory: Path, step: int) -> Path:
    path = directory / checkpoint.checkpoint_name(step)
    path.mkdir(parents=True)
    (path / META).write_text(f'{{"step": {step}}}')
    (directory / "latest").write_text(path.name + "\n")
    return path


def test_prune_keeps_the_newest_the_resumed_one_and_partial_folders(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        _complete(tmp_path, step)
    (tmp_path / (checkpoint.checkpoint_name(6) + ".partial")).mkdir()  # being written
    (tmp_path / checkpoint.checkpoint_name(7)).mkdir()  # no metadata: not complete, not counted
    removed = prune(tmp_path, 2, keep=tmp_path / checkpoint.checkpoint_name(2))
    assert [p.name for p in removed] == [checkpoint.checkpoint_name(1), checkpoint.checkpoint_name(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest",
        *(checkpoint.checkpoint_name(s) for s in (2, 4, 5)),
        checkpoint.checkpoint_name(6) + ".partial",
        checkpoint.checkpoint_name(7),
    ]
    assert prune(tmp_path, 1) == [tmp_path / checkpoint.checkpoint_name(s) for s in (2, 4)]
    assert latest(tmp_path) == tmp_path / checkpoint.checkpoint_name(5)


def test_progress_every_step_of_a_short_run_and_every_tenth_of_a_long_one(caplog: pytest.LogCaptureFixture) -> None:
    assert (progress_every(50, None), progress_every(51, None), progress_every(500, 7), progress_every(5, 0)) == (
        1,
        10,
        7,
        0,
    )
    with caplog.at_level(logging.INFO, logger="runtime"):
        for step in range(25):
            log_step(step, 25, 10, loss=2.5, step_time_s=0.5, tokens_per_step=1024)
        log_step(0, 25, 0, loss=2.5, step_time_s=0.5, tokens_per_step=1024)  # 0: none
    assert caplog.messages == [
        "step 10/25  loss 2.5000  0.500 s  2048 tokens/s",
        "step 20/25  loss 2.5000  0.500 s  2048 tokens/s",
        "step 25/25  loss 2.5000  0.500 s  2048 tokens/s",  # the last, whatever the interval
    ]


def _run(plan: Path, tmp_path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "planner", "run", str(plan), "--report", str(tmp_path / "r.json"), *more]
    return subprocess.run(command, capture_output=True, text=True, timeout=200, check=False, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_a_run_logs_its_steps_and_keeps_the_last_checkpoints(tmp_path: Path) -> None:
    save_cluster(cpu_cluster(2), tmp_path / "cluster.json")
    plan = tmp_path / "plan.json"
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--output", str(plan)]
    result = CliRunner().invoke(app, [*search, "--global-batch-size", "4", "--seq-len", "32"])
    assert result.exit_code == 0, result.output
    ckpt = tmp_path / "ckpt"
    saving = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    first = _run(plan, tmp_path, "--steps", "4", *saving, "--keep-last", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert [(int(a), int(b)) for a, b in STEP_LINE.findall(first.stderr)] == [(s, 4) for s in (1, 2, 3, 4)]  # rank 0's
    assert sorted(p.name for p in ckpt.glob("step-*")) == [checkpoint.checkpoint_name(s) for s in (3, 4)]
    again = _run(plan, tmp_path, "--steps", "6", *saving, "--keep-last", "1", "--resume", "--log-every", "0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert not STEP_LINE.findall(again.stderr)
    # step 3 pruned once 4 was the newest; 4, resumed from, kept beside the newest
    assert sorted(p.name for p in ckpt.glob("step-*")) == [checkpoint.checkpoint_name(s) for s in (4, 6)]
