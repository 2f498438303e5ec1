"""Sharded data parallelism (ZeRO 2-3), hand-worked from the collectives and the profile's records.

Under a pipeline, torch.distributed.pipelining reduces a sharded stage's gradients once, after
its last backward, so the stage holds what ZeRO-1 holds and ZeRO-3 gathers m + 1 times
(cost_models.pipeline.defers_gradient_reduction). FSDP's own cost per unit and micro-batch is
what the profiler timed (compute.measured_sharded_unit_s)."""

from dataclasses import replace

import pytest
from conftest import cpu_cluster

from cost_models import groups as grp
from cost_models.comm import slowest_collective_s
from cost_models.estimate import estimate
from cost_models.memory import stage_memory
from cost_models.params import stage_params
from cost_models.pipeline import defers_gradient_reduction
from cost_models.sharding import (
    Collectives,
    OverlapWindow,
    StepCollectives,
    held_zero_stage,
    optimizer_shard_params,
    step_collectives,
)
from planner.files.models import load_model
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    DeviceKind,
    DType,
    Layout,
    PipelineBuffers,
    ShardedUnitRecord,
    TrainingSpec,
    ZeroStage,
)

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=16, seq_len=128, dtype=DType.BF16, grad_reduce_dtype=DType.BF16)
CPU = cpu_cluster(4)
assert CPU.device.kind is DeviceKind.CPU  # so no data-parallel traffic hides behind the backward


def _layout(p: int, zero: ZeroStage) -> Layout:
    """The 4 ranks as 4 / p replicas of p stages."""
    return Layout(
        data_parallel_degree=4 // p,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        zero_stage=zero,
    )


def test_only_sharded_data_parallel_stages_of_a_pipeline_defer() -> None:
    assert defers_gradient_reduction(_layout(2, ZeroStage.GRADIENTS))
    assert defers_gradient_reduction(_layout(2, ZeroStage.PARAMETERS))
    assert not defers_gradient_reduction(_layout(2, ZeroStage.OPTIMIZER))
    assert not defers_gradient_reduction(_layout(1, ZeroStage.PARAMETERS))
    one_replica = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
    )
    assert not defers_gradient_reduction(one_replica)


def test_a_pipelined_stage_holds_what_zero_1_holds() -> None:
    training = TRAINING.model_copy(update={"pipeline_buffers": PipelineBuffers.PER_TRANSFER})  # buckets alone
    for stage in range(2):
        zero1 = stage_memory(MODEL, training, CPU, _layout(2, ZeroStage.OPTIMIZER), stage)
        for zero in (ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
            # but for ZeRO-1's gradient buckets: FSDP reduces from the units' own gradients
            held = replace(zero1, communication_buffers_bytes=0.0)
            assert stage_memory(MODEL, training, CPU, _layout(2, zero), stage) == held
    # Without a pipeline ZeRO-2 does shard the gradients, in fp32 as FSDP keeps them: 4 bytes over
    # d = 4 where ZeRO-1 keeps 2 bytes, half of ZeRO-1's.
    flat1 = stage_memory(MODEL, TRAINING, CPU, _layout(1, ZeroStage.OPTIMIZER), 0)
    flat2 = stage_memory(MODEL, TRAINING, CPU, _layout(1, ZeroStage.GRADIENTS), 0)
    assert flat2.gradients_bytes == pytest.approx(flat1.gradients_bytes / 2)


def _per_unit_s(op: CollectiveOp, layout: Layout, stage: int) -> float:
    """One unit's collective of ``stage``'s dense gradient (2 bytes a parameter), times its units."""
    held = stage_params(MODEL, layout, stage)
    groups = list(grp.data_groups(layout, stage))
    return held.units * slowest_collective_s(op, 2 * held.dense / held.units, groups, CPU)


@pytest.mark.parametrize(("zero", "gathers"), [(ZeroStage.GRADIENTS, 1), (ZeroStage.PARAMETERS, 8 + 1)])
def test_a_pipelined_stage_reduces_once_and_gathers_once_or_m_plus_1_times(zero: ZeroStage, gathers: int) -> None:
    layout = _layout(2, zero)  # m = 8: 16 sequences over 2 replicas of micro-batch 1
    expected = max(
        _per_unit_s(CollectiveOp.REDUCE_SCATTER, layout, s) + gathers * _per_unit_s(CollectiveOp.ALL_GATHER, layout, s)
        for s in range(2)
    )
    # On a CPU nothing is hidden: the whole of it is on the step.
    assert estimate(MODEL, TRAINING, CPU, layout).time.data_parallel_comm_s == pytest.approx(expected)


def test_without_a_pipeline_zero_3_gathers_twice_and_reduces_every_micro_batch() -> None:
    layout = _layout(1, ZeroStage.PARAMETERS)
    m = 4  # 16 sequences over 4 replicas of micro-batch 1
    expected = m * (
        _per_unit_s(CollectiveOp.REDUCE_SCATTER, layout, 0) + 2 * _per_unit_s(CollectiveOp.ALL_GATHER, layout, 0)
    )
    assert estimate(MODEL, TRAINING, CPU, layout).time.data_parallel_comm_s == pytest.approx(expected)


def _with_sharded_units(seconds: dict[tuple[int, int], float], dtype: DType = DType.BF16) -> ClusterProfile:
    records = tuple(
        ShardedUnitRecord(zero_stage=ZeroStage(zero), deferred=bool(deferred), dtype=dtype, time_s=s)
        for (zero, deferred), s in seconds.items()
    )
    return CPU.model_copy(update={"device": CPU.device.model_copy(update={"op_records": records})})


TIMED = {(2, 0): 1e-3, (3, 0): 2e-3, (2, 1): 3e-3, (3, 1): 4e-3}


@pytest.mark.parametrize("zero", [ZeroStage.GRADIENTS, ZeroStage.PARAMETERS])
def test_fsdp_costs_its_own_time_for_every_unit_and_micro_batch(zero: ZeroStage) -> None:
    # dp 4, micro-batch 1: m = 4 micro-batches through tiny-gpt's 4 layers and the root module
    # (embedding, final norm, head): 5 units, 4 x 5 = 20 times the timed cost.
    layout = _layout(1, zero)
    assert stage_params(MODEL, layout, 0).units == 5
    own_s = TIMED[zero, 0]
    timed = estimate(MODEL, TRAINING, _with_sharded_units(TIMED), layout)
    untimed = estimate(MODEL, TRAINING, CPU, layout)
    assert timed.time.compute_s - untimed.time.compute_s == pytest.approx(4 * 5 * own_s)
    assert timed.time.data_parallel_comm_s == untimed.time.data_parallel_comm_s
    # The record of another precision serves when the plan's is missing.
    fp32 = estimate(MODEL, TRAINING, _with_sharded_units(TIMED, DType.FP32), layout)
    assert fp32.step_time_s == pytest.approx(timed.step_time_s)


def test_a_pipelined_stage_takes_the_deferred_cost() -> None:
    # dp 2 x pp 2: every stage's micro-batch takes its units x the deferred ZeRO-3 cost.
    layout = _layout(2, ZeroStage.PARAMETERS)
    timed = estimate(MODEL, TRAINING, _with_sharded_units(TIMED), layout)
    untimed = estimate(MODEL, TRAINING, CPU, layout)
    for stage in range(2):
        units = stage_params(MODEL, layout, stage).units
        added = timed.stages[stage].compute_per_micro_batch_s - untimed.stages[stage].compute_per_micro_batch_s
        assert added == pytest.approx(units * TIMED[3, 1])


def test_unsharded_layouts_take_no_fsdp_cost() -> None:
    for layout in (_layout(1, ZeroStage.OPTIMIZER), _layout(2, ZeroStage.NONE)):
        assert estimate(MODEL, TRAINING, _with_sharded_units(TIMED), layout) == estimate(MODEL, TRAINING, CPU, layout)


def test_what_each_zero_stage_shards() -> None:
    # Rajbhandari et al. (SC20) fig. 1: P_os, P_os+g, P_os+g+p.
    table = {zero: (zero.shards_optimizer_states, zero.shards_gradients, zero.shards_parameters) for zero in ZeroStage}
    assert table == {
        ZeroStage.NONE: (False, False, False),
        ZeroStage.OPTIMIZER: (True, False, False),
        ZeroStage.GRADIENTS: (True, True, False),
        ZeroStage.PARAMETERS: (True, True, True),
    }


def test_a_pipeline_holds_zero_1s_states_under_zero_2_and_3() -> None:
    assert held_zero_stage(_layout(2, ZeroStage.PARAMETERS)) is ZeroStage.OPTIMIZER
    assert held_zero_stage(_layout(2, ZeroStage.GRADIENTS)) is ZeroStage.OPTIMIZER
    assert held_zero_stage(_layout(1, ZeroStage.PARAMETERS)) is ZeroStage.PARAMETERS
    assert held_zero_stage(_layout(2, ZeroStage.NONE)) is ZeroStage.NONE


@pytest.mark.parametrize(
    ("p", "zero", "expected"),
    [
        # One all-reduce, bucket by bucket in the last backward; the last bucket waits for it.
        *(
            (
                p,
                ZeroStage.NONE,
                StepCollectives(
                    per_micro_batch=Collectives(),
                    per_step=Collectives(all_reduce=1),
                    unit_by_unit=False,
                    window=OverlapWindow.LAST_BACKWARD,
                    edges=Collectives(all_reduce=1),
                ),
            )
            for p in (1, 2)
        ),
        (
            1,
            ZeroStage.OPTIMIZER,
            StepCollectives(
                per_micro_batch=Collectives(),
                per_step=Collectives(reduce_scatter=1, all_gather=1),
                unit_by_unit=False,
                window=OverlapWindow.LAST_BACKWARD,
                edges=Collectives(reduce_scatter=1, all_gather=1),
            ),
        ),
        (
            1,
            ZeroStage.GRADIENTS,
            StepCollectives(
                per_micro_batch=Collectives(reduce_scatter=1),
                per_step=Collectives(all_gather=1),
                unit_by_unit=True,
                window=OverlapWindow.EVERY_BACKWARD,
                edges=Collectives(reduce_scatter=1),
                edges_every_micro_batch=True,
            ),
        ),
        (
            1,
            ZeroStage.PARAMETERS,
            StepCollectives(
                per_micro_batch=Collectives(reduce_scatter=1, all_gather=2),
                per_step=Collectives(),
                unit_by_unit=True,
                window=OverlapWindow.ALL_COMPUTE,
                edges=Collectives(reduce_scatter=1, all_gather=1),
                edges_every_micro_batch=True,
            ),
        ),
        # Pipelined, m = 8: one reduction after the last backward, nothing left to hide it ...
        (
            2,
            ZeroStage.GRADIENTS,
            StepCollectives(
                per_micro_batch=Collectives(),
                per_step=Collectives(),
                unit_by_unit=True,
                window=OverlapWindow.NONE,
                exposed=Collectives(reduce_scatter=1, all_gather=1),
            ),
        ),
        # ... while ZeRO-3's m + 1 gathers still run behind the compute, all but the first.
        (
            2,
            ZeroStage.PARAMETERS,
            StepCollectives(
                per_micro_batch=Collectives(),
                per_step=Collectives(all_gather=9),
                unit_by_unit=True,
                window=OverlapWindow.ALL_COMPUTE,
                exposed=Collectives(reduce_scatter=1),
                edges=Collectives(all_gather=1),
            ),
        ),
    ],
)
def test_the_collectives_each_zero_stage_runs_per_step(p: int, zero: ZeroStage, expected: StepCollectives) -> None:
    m = 16 // (4 // p)
    assert step_collectives(_layout(p, zero), m) == expected


def test_a_step_of_several_pipeline_schedules_reduces_after_each() -> None:
    # p 2, m 8 in f = 4 schedules of 2: ZeRO-3 reduce-scatters after each schedule's last backward
    # (4, exposed) and gathers for each backward and each schedule's first forward (8 + 4).
    zero3 = step_collectives(_layout(2, ZeroStage.PARAMETERS), 8, flushes=4)
    assert (zero3.exposed, zero3.per_step) == (Collectives(reduce_scatter=4), Collectives(all_gather=12))
    # ZeRO-2 keeps its gathered weights: one all-gather after the optimizer step, 4 reductions.
    zero2 = step_collectives(_layout(2, ZeroStage.GRADIENTS), 8, flushes=4)
    assert zero2.exposed == Collectives(reduce_scatter=4, all_gather=1)


def test_a_step_s_collectives_add_up_and_its_edges_are_single_pieces() -> None:
    plan = step_collectives(_layout(2, ZeroStage.PARAMETERS), 8)
    run_s = {CollectiveOp.ALL_GATHER: 2.0, CollectiveOp.REDUCE_SCATTER: 3.0}
    piece_s = {CollectiveOp.ALL_GATHER: 0.5, CollectiveOp.REDUCE_SCATTER: 0.75}
    assert plan.time_s(run_s, 8) == 9 * 2.0 + 3.0
    assert plan.unhidden_s(run_s, piece_s, 8) == 3.0 + 0.5


def test_without_a_pipeline_zero_3_waits_for_its_edges_in_every_micro_batch() -> None:
    # FSDP gathers and reduces in every micro-batch: each forward waits for its first unit's
    # gather, each backward for its last unit's reduce-scatter; m = 4 micro-batches wait 4 times.
    plan = step_collectives(_layout(1, ZeroStage.PARAMETERS), 4)
    run_s = {CollectiveOp.ALL_GATHER: 2.0, CollectiveOp.REDUCE_SCATTER: 3.0}
    piece_s = {CollectiveOp.ALL_GATHER: 0.5, CollectiveOp.REDUCE_SCATTER: 0.75}
    assert plan.unhidden_s(run_s, piece_s, 4) == 4 * (0.5 + 0.75)
    # ZeRO-1 reduces once a step: its edges wait once.
    once = step_collectives(_layout(1, ZeroStage.OPTIMIZER), 4)
    assert once.unhidden_s(run_s, piece_s, 4) == 0.5 + 0.75


def test_the_optimizer_steps_the_ranks_shard() -> None:
    # tiny-moe at dp 4, ep 2: 461,952 dense parameters and 786,432 of the rank's experts; ZeRO 1-3
    # shard the dense ones over 4 ranks and the experts over the 4 / 2 ranks holding the same.
    moe = load_model("tiny-moe")
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        expert_parallel_degree=2,
        micro_batch_size=1,
    )
    held = stage_params(moe, layout, 0)
    assert (held.dense, held.expert) == (461_952, 786_432)
    assert optimizer_shard_params(held, layout) == 461_952 + 786_432
    for zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS):
        assert optimizer_shard_params(held, replace(layout, zero_stage=zero)) == 461_952 / 4 + 786_432 / 2
