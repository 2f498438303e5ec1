"""An evaluation checks its layout once: the evaluator's memory check validates the layout and
prices it without ``estimate``'s own check; ``estimate`` called directly still checks."""

from typing import Any

import pytest

import cost_models.estimate
import planner.search_engine.evaluate
from cost_models.estimate import estimate
from cost_models.layout_validity import check_layout
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec
from planner.schemas.errors import DoesNotFitError, InfeasibleConfigError
from planner.search_engine.evaluate import Evaluator

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-a100-80g:1")
TRAINING = TrainingSpec(global_batch_size=8, seq_len=2048)
FITS = Layout(data_parallel_degree=1, tensor_parallel_degree=8, pipeline_parallel_degree=1, micro_batch_size=1)
ODD_TP = Layout(data_parallel_degree=1, tensor_parallel_degree=3, pipeline_parallel_degree=1, micro_batch_size=1)
TOO_BIG = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Layout]:
    """Every layout ``check_layout`` is asked about, through either module that calls it."""
    seen: list[Layout] = []

    def counted(*args: Any) -> None:
        seen.append(args[-1])
        check_layout(*args)

    monkeypatch.setattr(planner.search_engine.evaluate, "check_layout", counted)
    monkeypatch.setattr(cost_models.estimate, "check_layout", counted)
    return seen


@pytest.mark.parametrize("record_points", [False, True], ids=["plain", "record-points"])
def test_a_fitting_layout_is_checked_once_per_evaluation(checks: list[Layout], record_points: bool) -> None:
    evaluate = Evaluator(MODEL, TRAINING, CLUSTER, record_points=record_points)
    evaluate(FITS)
    assert checks == [FITS]
    evaluate(FITS, evaluate.memory(FITS))  # the caller's memory check is the evaluation's one check
    assert checks == [FITS, FITS]


def test_a_layout_that_does_not_fit_is_checked_once_even_when_its_point_is_recorded(checks: list[Layout]) -> None:
    evaluate = Evaluator(MODEL, TRAINING, CLUSTER, record_points=True)
    with pytest.raises(DoesNotFitError):
        evaluate(TOO_BIG)
    assert checks == [TOO_BIG]
    assert evaluate.points is not None and len(evaluate.points) == 1


def test_estimate_called_directly_still_checks(checks: list[Layout]) -> None:
    estimate(MODEL, TRAINING, CLUSTER, FITS)
    assert checks == [FITS]
    with pytest.raises(InfeasibleConfigError, match="does not divide num_attention_heads"):
        estimate(MODEL, TRAINING, CLUSTER, ODD_TP)
