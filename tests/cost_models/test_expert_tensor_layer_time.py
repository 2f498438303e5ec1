"""An MoE model's real tensor-parallel layer (the profile's ``tp_layer`` record: the runtime's MoE
layer, experts split over the group) prices an MoE layer's compute plus tensor-parallel time
once: its MoE part is not added again by the modeled difference between an MoE and a dense
layer."""

import pytest
from conftest import make_cluster

from cost_models.estimate import estimate
from planner.files.models import load_model
from planner.schemas import ClusterProfile, DType, Estimate, LayerRecord, Layout, OpKind, TrainingSpec

TINY_MOE = load_model("tiny-moe")  # 4 MoE layers
TRAINING = TrainingSpec(global_batch_size=8, seq_len=128)
LAYOUT = Layout(data_parallel_degree=1, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=4)
"""tp 2, micro-batch 4: 8 / 4 = 2 micro-batches."""


def _estimate(flop_scale: float, tp_layer_fwd_bwd_s: float = 100e-3) -> Estimate:
    """tiny-moe on 2 devices whose peak FLOP/s are scaled by ``flop_scale``, with a dense local
    layer record (1 + 2 ms), a real tensor-parallel layer record (40 ms forward, and
    ``tp_layer_fwd_bwd_s``) and an output-layer record (5 ms), all at tp 2 and micro-batch 4."""
    shape = {"model": TINY_MOE.name, "tensor_parallel_degree": 2, "micro_batch_size": 4, "seq_len": 128}
    records = (
        LayerRecord(op=OpKind.LAYER, **shape, dtype=DType.BF16, fwd_time_s=1e-3, fwd_bwd_time_s=3e-3),
        LayerRecord(
            op=OpKind.TP_LAYER,
            **shape,
            sequence_parallel=False,
            dtype=DType.BF16,
            fwd_time_s=40e-3,
            fwd_bwd_time_s=tp_layer_fwd_bwd_s,
        ),
        LayerRecord(
            op=OpKind.OUTPUT_LAYER,
            **shape,
            sequence_parallel=False,
            dtype=DType.BF16,
            fwd_time_s=2e-3,
            fwd_bwd_time_s=5e-3,
        ),
    )
    cluster: ClusterProfile = make_cluster(per_node=2)
    peak = {dt: flop_s * flop_scale for dt, flop_s in cluster.device.peak_flop_per_s.items()}
    device = cluster.device.model_copy(update={"op_records": records, "peak_flop_per_s": peak})
    return estimate(TINY_MOE, TRAINING, cluster.model_copy(update={"device": device}), LAYOUT)


def _layers_and_tp_s(est: Estimate) -> float:
    return est.time.compute_s + est.time.tensor_parallel_comm_s


def test_an_moe_layers_compute_and_tensor_parallel_time_add_up_to_its_record() -> None:
    # Each MoE layer's compute is the local dense layer (3 ms) plus the modeled MoE difference D,
    # which scales with the device's FLOP/s; its tensor-parallel time is the record (100 ms)
    # minus that same local MoE layer. Their sum, 100 ms, does not depend on D: a device 10x
    # slower at GEMMs moves time from tensor-parallel time to compute, and changes nothing else
    # here (the output layer is a record, the rest memory-bound).
    fast, slow = _estimate(1.0), _estimate(0.1)
    moved_s = slow.time.compute_s - fast.time.compute_s
    assert moved_s > 1e-4  # D grew: the MoE layers' modeled experts and router are in the compute
    assert fast.time.tensor_parallel_comm_s - slow.time.tensor_parallel_comm_s == pytest.approx(moved_s, rel=1e-9)
    assert _layers_and_tp_s(slow) == pytest.approx(_layers_and_tp_s(fast), rel=1e-12)
    # 2 micro-batches x 4 layers x 50 ms more in the record is 400 ms more, all of it priced
    assert _layers_and_tp_s(_estimate(1.0, 150e-3)) - _layers_and_tp_s(fast) == pytest.approx(2 * 4 * 50e-3, rel=1e-9)
