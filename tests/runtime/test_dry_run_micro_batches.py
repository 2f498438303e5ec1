"""A dry run without a pipeline traces a step of at most 3 micro-batches (runtime.dry_run's
TRACED_MICRO_BATCHES): the peak of a longer step is the same, traced in a fraction of the time."""

import pytest

from cost_models.activations import mlp_backward_bytes
from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import Layout, Plan, Recompute, TrainingSpec, ZeroStage
from runtime.dry_run import TRACED_MICRO_BATCHES, dry_run, traced_global_batch

MICRO_BATCHES = 6

pytestmark = pytest.mark.slow


def _plan(zero: ZeroStage, recompute: Recompute, pipeline: int = 1, flushes: int = 1) -> Plan:
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:1")
    layout = Layout(
        data_parallel_degree=8 // pipeline,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=pipeline,
        micro_batch_size=2,
        zero_stage=zero if pipeline == 1 else ZeroStage.NONE,
        recompute=recompute,
    )
    training = TrainingSpec(
        global_batch_size=(8 // pipeline) * 2 * MICRO_BATCHES, seq_len=128, pipeline_flushes=flushes
    )
    return make_plan(model, training, cluster, "dgx-h100:1", layout, estimate(model, training, cluster, layout))


def test_the_traced_batch_is_capped_only_without_a_pipeline() -> None:
    flat = _plan(ZeroStage.NONE, Recompute.NONE)
    assert traced_global_batch(flat) == 8 * 2 * TRACED_MICRO_BATCHES == 48
    assert traced_global_batch(flat, cap=MICRO_BATCHES) == flat.training.global_batch_size == 96
    piped = _plan(ZeroStage.NONE, Recompute.NONE, pipeline=2)
    assert traced_global_batch(piped) == piped.training.global_batch_size
    # a step of 3 pipeline schedules is traced as one of them: 48 / 3
    assert traced_global_batch(_plan(ZeroStage.NONE, Recompute.NONE, pipeline=2, flushes=3)) == 16


def test_a_pipeline_of_fewer_micro_batches_a_schedule_holds_less_as_estimated() -> None:
    # pp 2: 6 micro-batches in one schedule keep 2 in flight on the first stage; in 6 schedules of
    # one, 1. The estimate's activations held halve (by 2.11 MB) beside one MLP's backward either way
    # (GELU: 2 tensors of s b f); the stage's receive buffers, one per micro-batch of a schedule,
    # go from 6 to 1 and its outputs kept from 2 to 1 (6 of 128 x 2 x 128 x 2 bytes, 0.39 MB). The
    # trace drops by about the sum (measured 2.79 MB against 2.50 MB: this tiny model's activations
    # trace above their estimate, as its stages do).
    one, six = (_plan(ZeroStage.NONE, Recompute.NONE, pipeline=2, flushes=f) for f in (1, 6))
    held = [p.estimate.stages[0].memory.activations_bytes for p in (one, six)]
    backward = mlp_backward_bytes(one.model, 128 * 2 * one.model.ffn_size, one.training.dtype)
    assert held[1] - backward == pytest.approx((held[0] - backward) / 2)
    buffers = [p.estimate.stages[0].memory.communication_buffers_bytes for p in (one, six)]
    assert buffers[0] - buffers[1] == 6 * 128 * 2 * one.model.hidden_size * 2
    traced = [dry_run(p, 0).peak_bytes for p in (one, six)]
    assert traced[0] - traced[1] == pytest.approx(held[0] - held[1] + buffers[0] - buffers[1], rel=0.25)


@pytest.mark.parametrize(
    ("zero", "recompute"),
    [
        (ZeroStage.OPTIMIZER, Recompute.FULL),
        (ZeroStage.GRADIENTS, Recompute.NONE),
        (ZeroStage.PARAMETERS, Recompute.SELECTIVE),
    ],
)
def test_a_step_of_3_micro_batches_peaks_as_one_of_6(zero: ZeroStage, recompute: Recompute) -> None:
    plan = _plan(zero, recompute)
    capped = dry_run(plan, 0)
    whole = dry_run(plan, 0, micro_batches_cap=MICRO_BATCHES)
    # To the byte: the capped trace adds back the untraced sequences' token ids (int64).
    assert capped.peak_bytes == whole.peak_bytes
    assert capped.breakdown_bytes == whole.breakdown_bytes
