"""For every SC21 Table 1 run, the search's choice fits in 80 GB and is predicted at least as
fast as the configuration the authors published (both priced by our cost models)."""

import sys
from pathlib import Path

import pytest

from planner import api
from planner.schemas.settings import SearchSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from sc21 import SC21_TABLE1, Sc21Run, predict


@pytest.mark.slow
@pytest.mark.parametrize("run", SC21_TABLE1, ids=lambda r: r.name)
def test_search_beats_or_matches_the_published_configuration(run: Sc21Run) -> None:
    published, _ = predict(run)
    (best,) = api.search(run.model(), f"dgx-a100-80g:{run.gpus // 8}", run.training(), SearchSettings(top_k=1))
    assert best.estimate.peak_memory_bytes <= 80 * 2**30
    assert best.estimate.tokens_per_s >= published.tokens_per_s * (1 - 1e-9)
