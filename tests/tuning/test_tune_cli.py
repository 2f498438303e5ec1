"""`planner tune` end to end on a local 2-rank CPU cluster: real jobs, one made to crash; the
crash is recorded and the tuner goes on; the calibration lands in the profile; a second tune
runs nothing; `planner validate` shows the stored study.

The `planner` commands run in the test process (harness.planner_main, in the test's directory):
the plans' jobs are the real processes, the launcher starts them."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_cluster
from harness import planner_main

from planner.files.clusters import load_cluster, save_cluster

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]


def _run(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess[str]:
    code, out, err = planner_main(args, monkeypatch, cwd=cwd)
    return subprocess.CompletedProcess(["planner", *args], code, out, err)


def test_tune_records_a_crash_calibrates_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_cluster(cpu_cluster(2), tmp_path / "cluster.json")
    save_cluster(cpu_cluster(2), tmp_path / "measured.json")  # the same profile, to stay uncalibrated
    # The second job crashes; the others run torchrun of this interpreter on this machine.
    torchrun = shlex.join([sys.executable, "-m", "torch.distributed.run"])
    launcher = (
        "n=$(cat jobs 2>/dev/null || echo 0); echo $((n + 1)) > jobs; "
        "if [ $n -eq 1 ]; then echo '[rank0]: RuntimeError: injected crash' >&2; exit 7; fi; "
        f"OMP_NUM_THREADS=1 {torchrun} --standalone --nproc-per-node {{nproc_per_node}} {{run_args}}"
    )
    args = [
        "tune",
        *("-m", "tiny-gpt", "-c", "cluster.json", "--global-batch-size", "8", "--seq-len", "32"),
        *("--top-k", "4", "--steps", "3", "--launcher", launcher, "--output", "best.json"),
    ]
    first = _run(args, tmp_path, monkeypatch)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "failed: exit code 7: RuntimeError: injected crash" in first.stdout
    assert "4 plans run now, 4 in all" in first.stdout
    assert "calibrated, leave-one-out (3 plans)" in first.stdout
    calibration = load_cluster(str(tmp_path / "cluster.json")).calibration
    # Time factors fitted on the 3 measured plans, or left at identity when they predicted the
    # held-out plans no better (real runs: either may happen).
    assert calibration is not None and calibration.trials in (0, 3)
    assert calibration.trials == 3 or calibration.compute_scale == 1.0
    assert (tmp_path / "tune" / "validation.png").stat().st_size > 10_000
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["model"]["name"] == "tiny-gpt"

    # The same tune again (on the uncalibrated copy, so that the search ranks as before) finds
    # every plan finished, the crashed one included, and runs nothing.
    again = [a if a != "cluster.json" else "measured.json" for a in args]
    second = _run([*again, "--no-calibrate"], tmp_path, monkeypatch)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0 plans run now, 4 in all" in second.stdout
    assert (tmp_path / "jobs").read_text().strip() == "4"

    shown = _run(["validate", "--plot", "again.png"], tmp_path, monkeypatch)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Spearman rank correlation" in shown.stdout and (tmp_path / "again.png").exists()


def test_tune_on_a_preset_needs_a_place_for_the_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "32"]
    result = _run(args, tmp_path, monkeypatch)
    assert result.returncode == 2
    assert "--save-calibration PATH" in result.stderr and not (tmp_path / "tune.db").exists()
