"""The rank figures (Spearman, top-1 regret) of a validation on so few plans that no ordering is
significant say so instead of standing as if they meant something."""

import io

from rich.console import Console

from planner.tuning.validate import MIN_PLANS_FOR_RANKS, PlanResult, validate
from planner.views.tune_tables import validation_table


def _plans(n: int) -> list[PlanResult]:
    # measured in the reverse order of the prediction: Spearman -1
    return [
        PlanResult(label=f"p{i}", predicted_step_time_s=1.0 + i, measured_step_time_s=10.0 - i, memory=())
        for i in range(n)
    ]


def _shown(n: int) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(validation_table([validate("uncalibrated model", _plans(n))]))
    return out.getvalue()


def test_few_plans_flag_their_rank_figures() -> None:
    few = _shown(MIN_PLANS_FOR_RANKS - 1)
    assert "-1.000 (too few plans)" in few and "mean nothing" in few
    enough = _shown(MIN_PLANS_FOR_RANKS)
    assert "-1.000" in enough and "too few" not in enough and "mean nothing" not in enough
