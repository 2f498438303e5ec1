"""Data-parallel communication per ZeRO stage, hand-worked from ring collectives.

tiny-gpt on one node of 4 devices (100 GB/s links, 1 us latency), dp 4, no pipeline: the one
stage holds 957,184 parameters in 5 units (4 layers and the root: embedding, final norm, head),
1,914,368 bytes of bf16 gradients, summed in bf16 (Megatron-LM's --grad-reduce-in-bf16) but for
the last test's fp32 (the default under bf16). A ring over n = 4 takes (n - 1) latencies and moves
(n - 1)/n of the buffer for a reduce-scatter or an all-gather, twice that for an all-reduce.
16 sequences over 4 replicas of micro-batch 1: m = 4 micro-batches.
"""

from datetime import UTC, datetime

import pytest
from conftest import cpu_cluster, make_cluster

from cost_models import groups as grp
from cost_models.data_parallel import (
    data_parallel_time,
    overlap_window_s,
    stage_data_parallel_comm,
)
from cost_models.estimate import estimate
from cost_models.overlap import OVERLAP_COMPUTE_SLOWDOWN, hides_communication
from cost_models.params import stage_params
from cost_models.sharding import OverlapWindow
from cost_models.timing import StageTime, stage_times
from planner.files.models import load_model
from planner.schemas import Calibration, DType, Layout, TrainingSpec, ZeroStage

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=16, seq_len=128, dtype=DType.BF16, grad_reduce_dtype=DType.BF16)
GPU = make_cluster(per_node=4)
CPU = cpu_cluster(4)
M = 4

ALL_REDUCE_S = 2 * 3 * 1e-6 + 2 * 0.75 * 1_914_368 / 100e9  # 34.71552 us
WHOLE_S = 3 * 1e-6 + 0.75 * 1_914_368 / 100e9  # one reduce-scatter or all-gather: 17.35776 us
UNITS_S = 5 * (3 * 1e-6 + 0.75 * 1_914_368 / 5 / 100e9)  # the same unit by unit: 29.35776 us
COMM_S = {
    ZeroStage.NONE: ALL_REDUCE_S,  # one all-reduce of the accumulated gradients
    ZeroStage.OPTIMIZER: 2 * WHOLE_S,  # one reduce-scatter, one all-gather of the updated weights
    ZeroStage.GRADIENTS: M * UNITS_S + UNITS_S,  # a reduce-scatter every micro-batch, one all-gather
    ZeroStage.PARAMETERS: M * 3 * UNITS_S,  # every micro-batch: a reduce-scatter, 2 all-gathers
}
UNIT_S = UNITS_S / 5  # one unit's reduce-scatter or all-gather: 5.871552 us
# What no compute hides. The gradients fit one bucket, so without ZeRO and under ZeRO-1 that is
# everything; under ZeRO-2 the last unit's reduce-scatter, under ZeRO-3 also the first gather,
# in each of the M micro-batches (each reduces its own gradients and gathers its own weights).
UNHIDDEN_S = {
    ZeroStage.NONE: ALL_REDUCE_S,
    ZeroStage.OPTIMIZER: 2 * WHOLE_S,
    ZeroStage.GRADIENTS: M * UNIT_S,
    ZeroStage.PARAMETERS: M * 2 * UNIT_S,
}
SLOWED = OVERLAP_COMPUTE_SLOWDOWN / (1 + OVERLAP_COMPUTE_SLOWDOWN)  # 0.158957 of the hidden part
# One stage's times per micro-batch: 30 us of compute of which 20 us backward, 10 us recompute.
TIMES = (
    StageTime(
        compute_s=30e-6, recompute_s=10e-6, tensor_parallel_comm_s=0.0, expert_parallel_comm_s=0.0, backward_s=20e-6
    ),
)
WINDOW_S = {
    ZeroStage.NONE: 20e-6,  # the last backward
    ZeroStage.OPTIMIZER: 20e-6,
    ZeroStage.GRADIENTS: M * 20e-6,  # every backward
    ZeroStage.PARAMETERS: M * (30e-6 + 10e-6),  # all of the compute, recompute included
}


def _layout(zero: ZeroStage) -> Layout:
    return Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=zero,
    )


def test_the_worked_example_holds_what_it_says() -> None:
    held = stage_params(MODEL, _layout(ZeroStage.NONE), 0)
    assert (held.dense, held.expert, held.units) == (957_184, 0, 5)


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_each_zero_stage_runs_its_collectives(zero: ZeroStage) -> None:
    comm = stage_data_parallel_comm(MODEL, TRAINING, GPU, _layout(zero), 0, M)
    assert comm.total_s == pytest.approx(COMM_S[zero], rel=1e-12)
    assert comm.unhidden_s == pytest.approx(UNHIDDEN_S[zero], rel=1e-12)


# Summed in fp32, each gradient's reduction moves twice the bytes, 3,828,736; gathers stay bf16.
ALL_REDUCE_FP32_S = 2 * 3 * 1e-6 + 2 * 0.75 * 3_828_736 / 100e9  # 63.43104 us
REDUCE_SCATTER_FP32_S = 3 * 1e-6 + 0.75 * 3_828_736 / 100e9  # 31.71552 us
UNITS_FP32_S = 5 * (3 * 1e-6 + 0.75 * 3_828_736 / 5 / 100e9)  # 43.71552 us
COMM_FP32_S = {
    ZeroStage.NONE: ALL_REDUCE_FP32_S,
    ZeroStage.OPTIMIZER: REDUCE_SCATTER_FP32_S + WHOLE_S,  # 49.07328 us
    ZeroStage.GRADIENTS: M * UNITS_FP32_S + UNITS_S,  # 204.21984 us
    ZeroStage.PARAMETERS: M * (UNITS_FP32_S + 2 * UNITS_S),  # 409.72416 us
}


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_gradients_summed_in_fp32_move_twice_the_bytes_and_gathers_do_not(zero: ZeroStage) -> None:
    fp32 = TrainingSpec(global_batch_size=16, seq_len=128, dtype=DType.BF16)
    assert fp32.reduce_dtype is DType.FP32  # the default under bf16
    comm = stage_data_parallel_comm(MODEL, fp32, GPU, _layout(zero), 0, M)
    assert comm.total_s == pytest.approx(COMM_FP32_S[zero], rel=1e-12)


def test_one_replica_communicates_nothing() -> None:
    alone = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=4,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
    )
    assert stage_data_parallel_comm(MODEL, TRAINING, GPU, alone, 0, 16).total_s == 0.0


def test_overlap_windows() -> None:
    (stage,) = TIMES
    assert overlap_window_s(OverlapWindow.LAST_BACKWARD, stage, M) == 20e-6
    assert overlap_window_s(OverlapWindow.EVERY_BACKWARD, stage, M) == pytest.approx(80e-6)
    assert overlap_window_s(OverlapWindow.ALL_COMPUTE, stage, M) == pytest.approx(160e-6)
    assert overlap_window_s(OverlapWindow.NONE, stage, M) == 0.0


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_on_a_gpu_the_window_hides_what_it_can(zero: ZeroStage) -> None:
    assert hides_communication(GPU)
    dp = data_parallel_time(MODEL, TRAINING, GPU, _layout(zero), TIMES, M)
    # Without ZeRO and under ZeRO-1 the one bucket reduces after the backward: 34.7 and 34.7 us
    # exposed. Under ZeRO 2-3 the rest outlasts its window: 146.8 - 80 and 352.3 - 160 us exposed.
    expected = {
        ZeroStage.NONE: ALL_REDUCE_S,
        ZeroStage.OPTIMIZER: 2 * WHOLE_S,
        ZeroStage.GRADIENTS: COMM_S[zero] - WINDOW_S[zero],
        ZeroStage.PARAMETERS: COMM_S[zero] - WINDOW_S[zero],
    }
    assert dp.total_s == pytest.approx(COMM_S[zero], rel=1e-12)
    assert dp.exposed_s == pytest.approx(expected[zero], rel=1e-9)
    assert dp.overlapped_s == pytest.approx(COMM_S[zero] - expected[zero], rel=1e-9)


@pytest.mark.parametrize("zero", list(ZeroStage))
def test_on_a_cpu_nothing_is_hidden(zero: ZeroStage) -> None:
    assert not hides_communication(CPU)
    dp = data_parallel_time(MODEL, TRAINING, CPU, _layout(zero), TIMES, M)
    assert dp.exposed_s == dp.total_s == pytest.approx(COMM_S[zero], rel=1e-12)
    assert dp.overlapped_s == 0.0


def test_a_long_window_hides_all_but_the_edges_and_the_slowdown() -> None:
    long = (
        StageTime(
            compute_s=1.0, recompute_s=0.0, tensor_parallel_comm_s=0.0, expert_parallel_comm_s=0.0, backward_s=0.5
        ),
    )
    for zero in ZeroStage:
        dp = data_parallel_time(MODEL, TRAINING, GPU, _layout(zero), long, M)
        hidden_s = COMM_S[zero] - UNHIDDEN_S[zero]
        assert dp.exposed_s == pytest.approx(UNHIDDEN_S[zero] + SLOWED * hidden_s, rel=1e-9)
        assert dp.total_s == pytest.approx(COMM_S[zero], rel=1e-12)


def test_calibration_scales_the_communication_and_its_window_before_the_overlap() -> None:
    # ZeRO-3: communication x 3 = 1,056.9 us against all the compute x 2 = 320 us: 736.9 us exposed.
    zero = ZeroStage.PARAMETERS
    dp = data_parallel_time(MODEL, TRAINING, GPU, _layout(zero), TIMES, M, compute_scale=2.0, communication_scale=3.0)
    assert dp.total_s == pytest.approx(3 * COMM_S[zero], rel=1e-12)
    assert dp.exposed_s == pytest.approx(3 * COMM_S[zero] - 2 * WINDOW_S[zero], rel=1e-9)


def test_estimate_reports_the_data_parallel_terms() -> None:
    calibration = Calibration(
        communication_scale=3.0, compute_scale=2.0, created=datetime(2026, 1, 1, tzinfo=UTC), trials=1, memory_samples=0
    )
    for cluster in (GPU, GPU.model_copy(update={"calibration": calibration}), CPU):
        for zero in ZeroStage:
            layout = _layout(zero)
            times = stage_times(
                MODEL,
                TRAINING,
                cluster,
                layout,
                tensor_groups=grp.tensor_groups(layout),
                expert_groups=grp.expert_groups(layout),
            )
            scales = (calibration.compute_scale, calibration.communication_scale) if cluster.calibration else (1.0, 1.0)
            expected = data_parallel_time(
                MODEL, TRAINING, cluster, layout, times, M, compute_scale=scales[0], communication_scale=scales[1]
            )
            time = estimate(MODEL, TRAINING, cluster, layout).time
            assert time.data_parallel_comm_s == expected.exposed_s
            assert time.data_parallel_comm_overlapped_s == expected.overlapped_s


def test_stages_holding_the_same_parameters_are_priced_by_where_their_groups_sit() -> None:
    """2 nodes of 6, dp 4 x pp 3, the vocabulary split over the pipeline: stages 0 and 1 hold the
    same parameters (Llama has no learned positions), but stage 0's ranks 0-3 share a node while
    stage 1's ranks 4-7 span both, so its reduction crosses the slow link; the memoized pricing
    (``data_parallel_time``) must not hand stage 1 stage 0's time."""
    llama = load_model("llama3-8b")
    cluster = make_cluster(nodes=2, per_node=6)
    training = TrainingSpec(global_batch_size=24, seq_len=256)
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=3,
        micro_batch_size=1,
        layer_split=(11, 11, 10),
        vocabulary_layout="vocab-2",
    )
    assert stage_params(llama, layout, 0) == stage_params(llama, layout, 1)
    m = 6
    per_stage = [stage_data_parallel_comm(llama, training, cluster, layout, s, m).total_s for s in range(3)]
    assert per_stage[1] > 2 * per_stage[0]  # 10 GB/s across nodes against 100 GB/s inside one
    idle = StageTime(
        compute_s=0.0, recompute_s=0.0, tensor_parallel_comm_s=0.0, expert_parallel_comm_s=0.0, backward_s=0
    )
    dp = data_parallel_time(llama, training, cluster, layout, (idle, idle, idle), m)
    assert dp.total_s == pytest.approx(per_stage[1], rel=1e-12)
