"""Throughput in units a person reads at a glance: a CPU rank's GFLOP/s is no longer "0.0" of a
TFLOP/s column, a GPU's stays in TFLOP/s, to 3 significant figures."""

import json
from pathlib import Path

import pytest
from conftest import cpu_cluster
from typer.testing import CliRunner

from planner.cli import app
from planner.files.clusters import save_cluster
from planner.schemas import DType
from planner.views.tables import flop_rate


@pytest.mark.parametrize(
    ("flop_per_s", "shown"),
    [
        (52.64e9, "52.6 GFLOP/s"),  # a CPU rank: 52.64 / 1e9, 3 figures
        (0.9e12, "900 GFLOP/s"),  # below 1 TFLOP/s: GFLOP/s, no decimal needed for 3 figures
        (999.6e9, "1.00 TFLOP/s"),  # 999.6 rounds to 1000 GFLOP/s = 1.00 TFLOP/s
        (1.234e12, "1.23 TFLOP/s"),
        (148.23e12, "148 TFLOP/s"),  # an A100 at about half its 312 TFLOP/s
        (4.5e15, "4.50 PFLOP/s"),
        (2.5e18, "2500 PFLOP/s"),  # no unit above PFLOP/s: more digits, not an exponent
        (7.0e6, "7.00 MFLOP/s"),
        (999.4, "999 FLOP/s"),
        (0.5, "0.500 FLOP/s"),
        (0.0, "0 FLOP/s"),
    ],
)
def test_a_rate_is_three_figures_in_the_largest_unit_it_holds_one_of(flop_per_s: float, shown: str) -> None:
    assert flop_rate(flop_per_s) == shown


def test_estimate_on_a_cpu_cluster_prints_gflops_per_rank(tmp_path: Path) -> None:
    cluster = cpu_cluster(4)
    slow = {DType.BF16: 50e9, DType.FP16: 50e9, DType.FP32: 50e9}  # a few CPU cores
    device = cluster.device.model_copy(update={"peak_flop_per_s": slow})
    save_cluster(cluster.model_copy(update={"device": device}), tmp_path / "cpu.json")
    args = ["estimate", "-m", "tiny-gpt", "-c", str(tmp_path / "cpu.json"), "--global-batch-size", "8"]
    args += ["--seq-len", "128", "--dp", "4", "--dtype", "fp32"]
    est = json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).output)
    table = CliRunner(env={"COLUMNS": "200"}).invoke(app, args)
    assert table.exit_code == 0, table.output
    # What the row divides, from the JSON contract: hardware FLOPs a step / step time / 4 ranks.
    rate = est["hardware_flops_per_step"] / est["step_time_s"] / 4
    assert 1e9 <= rate < 50e9  # below the 50 GFLOP/s peak: the old "0.0 TFLOP/s" case
    row = next(line for line in table.output.splitlines() if "FLOP/s per rank (hardware)" in line)
    decimals = 2 if rate < 10e9 else 1  # 3 significant figures of a rate of 1 to 50 GFLOP/s
    assert f"{rate / 1e9:.{decimals}f} GFLOP/s" in row, row
    assert "TFLOP/s" not in table.output
