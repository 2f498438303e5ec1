"""The user guide's local walk runs as written: every block titled "Local CPU cluster" in
docs/guide.md, in order, in a fresh folder, with the project's planner and torchrun on the PATH.

Two steps stand in for what a 2-core CI machine cannot afford beside the rest of the suite (the
guide's note says so): the profile (a torchrun of 2 ranks, about a minute) is replaced by a
recorded 2-rank CPU profile of this project's profiler, copied to the cluster.json it would write;
the tune (a torchrun per plan) and the validate of its study are not run. Their command lines are
still parsed against the CLI and torchrun by tests/test_docs_commands.py. Every other line runs
for real: the planning commands, a dry run, and one run of the plan on 2 ranks for 4 steps (planner
launch --run: the torchrun line it prints, run in its process)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import LOCAL_TITLE, ROOT, Command, blocks, commands

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(400)]

GUIDE = ROOT / "docs" / "guide.md"
RECORDED_PROFILE = ROOT / "tests" / "golden" / "cluster_profile_v2_cpu_tiny_moe.json"
"""A 2-rank bf16 CPU profile, as the guide's profile line writes it."""


def _stand_in(command: Command, folder: Path) -> str | None:
    """What replaces ``command`` (a line of what it did), or None to run it."""
    if "profile" in command.argv and "planner" in command.argv:
        shutil.copy(RECORDED_PROFILE, folder / "cluster.json")
        return "profile: recorded"
    if command.argv[0] == "planner" and command.argv[1] in ("tune", "validate"):
        return f"{command.argv[1]}: not run"
    return None


def test_the_guide_local_walk_runs(tmp_path: Path) -> None:
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    local = [c for b in blocks(GUIDE) if b.title == LOCAL_TITLE for c in commands(b)]
    stood_in, ran = [], []
    for command in local:
        if (what := _stand_in(command, tmp_path)) is not None:
            stood_in.append(what)
            continue
        done = subprocess.run(
            ["bash", "-c", command.line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{command.line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        ran.append(command.argv[1] if command.argv[0] == "planner" else command.argv[0])
    assert stood_in == ["profile: recorded", "tune: not run", "validate: not run"]
    assert {"search", "estimate", "explain", "export", "run", "launch"} <= set(ran)
    report = json.loads((tmp_path / "report.json").read_text())  # launch --run's ranks wrote it
    assert report["steps"] == 4 and report["world_size"] == 2
    for name in ("plan.json", "megatron.args", "ds_config.json", "plots/schedule.png"):
        assert (tmp_path / name).stat().st_size > 0, name
