"""The FP8/BF16 throughput ratios against the published pairs (benchmarks/fp8_pairs.py): a
regression guard on today's agreement, the issue's target being every pair within 8%."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fp8_pairs import PAIRS, TARGET, _models, predicted_ratio


def test_the_pairs_span_three_sources_and_a_slower_fp8() -> None:
    assert len(PAIRS) >= 8 and len({p.source for p in PAIRS}) >= 3
    assert any(p.published_ratio < 1 for p in PAIRS)


def test_agreement_is_no_worse_than_today() -> None:
    # 14 of 17 within 8% and on the published side of 1.0; the misses were torchtitan's 70B
    # rowwise with async TP under tp 8 (published 1.065, predicted 1.234), its 70B tensorwise with
    # async TP (1.445, predicted 1.295), and LLM Foundry's MPT-3B at 32k tokens with
    # recomputation (0.997, predicted 1.093). With torch's async TP overlapping only the
    # collectives its micro-pipeline pass fuses under each torchao recipe (rowwise: the forward's
    # reduce-scatters), the rowwise pair is 1.037 (-2.7%): 15 of 17. Raise the bound as the model
    # improves.
    models = _models()
    within = 0
    for pair in PAIRS:
        ratio = predicted_ratio(pair, models[pair.model])
        within += abs(ratio / pair.published_ratio - 1) <= TARGET and (ratio >= 1) == (pair.published_ratio >= 1)
    assert within >= 15
