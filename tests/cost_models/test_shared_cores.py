"""Pipelines on shared cores (CPU ranks that outnumber their cores): hand-worked values."""

import pytest

from cost_models.shared_cores import shared_core_factor
from cost_models.timing import StageTime


def _stage(total_s: float) -> StageTime:
    return StageTime(
        compute_s=total_s, recompute_s=0.0, tensor_parallel_comm_s=0.0, expert_parallel_comm_s=0.0, backward_s=0.0
    )


def test_two_equal_stages_on_half_a_core_each() -> None:
    # 2 stages of 1 s a micro-batch, 2 micro-batches, 1F1B bubble (p - 1)/m x m x 1 s = 1 s: the
    # path is 3 s. Each stage is busy 2 s at half a core; while one waits the other runs at a
    # whole core, but the two cores' work, a mean of 2 s of busy time, bounds the step: 2/3.
    equal = (_stage(1.0), _stage(1.0))
    assert shared_core_factor(equal, 2, 1.0, 0.5) == pytest.approx(2 / 3)
    # Nearly a core each: the faster path, 0.9 x 3 s, bounds it.
    assert shared_core_factor(equal, 2, 1.0, 0.9) == pytest.approx(0.9)
    # A core each: nothing to gain.
    assert shared_core_factor(equal, 2, 1.0, 1.0) == 1.0


def test_an_unbalanced_pipeline_is_bounded_by_its_mean_stage() -> None:
    # Stages of 1 s and 3 s, 4 micro-batches, bubble 1/4 x 4 x 3 s = 3 s: the path is 15 s.
    # The mean stage is busy 4 x 2 s = 8 s; at a quarter core the faster path is 3.75 s.
    assert shared_core_factor((_stage(1.0), _stage(3.0)), 4, 3.0, 0.25) == pytest.approx(8 / 15)
