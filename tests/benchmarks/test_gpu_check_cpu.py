"""benchmarks/gpu_check.sh --cpu: the one-GPU check's every step on this machine's CPU, with tiny
models, so that the script a GPU run depends on cannot rot between GPU runs. One script run (a
one-rank quick profile, three searches, dry runs and one-rank runs under torchrun); what it
writes is read back here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CASES = ("dense", "dense-rc", "moe")


def test_every_step_of_the_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    env = os.environ | {"OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu"],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
        cwd=ROOT,
        env=env,
    )
    log = (tmp_path / "log.txt").read_text()
    assert done.returncode == 0, log[-4000:]
    assert "== all steps passed (cpu)" in log and "!! rc=" not in log
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["env"]["device"] == "cpu" and results["env"]["torch"]
    assert set(results["versus preset"]) == {"bf16 GEMM TFLOP/s", "HBM GB/s", "memory GiB"}
    fixture = json.loads((tmp_path / "cpu-profile.json").read_text())
    assert {"taken", "torch", "driver"} <= set(fixture["provenance"]["settings"])
    compared = results["compare"]
    assert set(compared) == set(CASES)
    for name in CASES:
        row = compared[name]
        assert row["measured step s"] > 0 and row["predicted step s"] > 0, row
        assert row["dry run bytes"] > 0 and row["preset step s"] > 0, row
        first, last = row["losses"]
        assert 0 < last < 1.2 * first, row  # trained, finite
        assert 0.5 < row["tensor memory ratio"] < 1.5, row  # the CPU's MemTracker beside the estimate
    assert compared["dense-rc"]["predicted tensor bytes"] < compared["dense"]["predicted tensor bytes"]
    assert (tmp_path / "compare.png").stat().st_size > 10_000
