"""The cost model against published measurements at scale: SC21 Table 1 (Megatron-LM on up to
3,072 A100s). The cluster is the dgx-a100-80g preset; nothing is fitted to these rows."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from sc21 import SC21_TABLE1, Sc21Run, predict


@pytest.mark.parametrize("run", SC21_TABLE1, ids=lambda r: r.name)
def test_predicted_throughput_is_within_10_percent_of_published(run: Sc21Run) -> None:
    est, tflops = predict(run)
    assert tflops == pytest.approx(run.published_tflops_per_gpu, rel=0.10)
    # The published configuration ran, so it must fit in the A100's 80 GB.
    assert est.fits


def test_hardware_flops_count_recomputation_as_the_paper_does() -> None:
    for run in SC21_TABLE1:
        est, _ = predict(run)
        assert est.hardware_flops_per_step == pytest.approx(run.eq3_flops(), rel=1e-9)
