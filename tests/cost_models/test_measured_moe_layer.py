"""An MoE layer priced from the profiler's timing of the runtime's own MoE layer (``moe_layer``
records, cluster profile version 3), and a version-2 profile without them priced as before."""

from pathlib import Path

import pytest

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import ClusterProfile, DType, Kernels, LayerRecord, Layout, OpKind, TrainingSpec

V2_TINY_MOE = Path(__file__).resolve().parents[1] / "golden" / "cluster_profile_v2_cpu_tiny_moe.json"
"""A version-2 profile of 2 CPU ranks, measured for tiny-moe (seq len 128, bf16) by the
profiler that timed only a dense-MLP layer."""
TINY_MOE = load_model("tiny-moe")
TRAINING = TrainingSpec(  # as priced then: gradients summed in bf16, fused kernels
    global_batch_size=32, seq_len=128, grad_reduce_dtype=DType.BF16, kernels=Kernels.FUSED
)

V2_ESTIMATES = {
    # (ep, micro-batch): (step s, compute s, peak memory bytes), computed by the planner before
    # the moe_layer record existed, on the same file (the memory re-frozen when the loss without
    # a pipeline stopped counting a second transient copy of the logits, and when the gradient buckets
    # took the precision gradients are summed in, bf16 here; the times when elementwise kernels began
    # to pay their launches, cost_models.kernels; at micro-batch 16, one micro-batch per step, the
    # memory less the gradients when those on demand began to replace the activations freed:
    # 4,069,632 and 2,496,768 bytes, memory.LayoutMemory).
    (1, 2): (0.5492770817767394, 0.5288042062997581, 44394752.0),
    (1, 16): (0.45870271949318075, 0.4382298440161995, 94701568.0),
    (2, 2): (0.6317856902802818, 0.5627846830204087, 28928256.0),
    (2, 16): (0.4524486952580075, 0.43517990339485774, 82642944.0),
}


def _layout(ep: int, micro_batch: int) -> Layout:
    return Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=micro_batch,
        expert_parallel_degree=ep,
    )


def _with_moe_layer(cluster: ClusterProfile, fwd_s: float, fwd_bwd_s: float, micro_batch: int = 2) -> ClusterProfile:
    record = LayerRecord(
        op=OpKind.MOE_LAYER,
        model=TINY_MOE.name,
        tensor_parallel_degree=1,
        micro_batch_size=micro_batch,
        seq_len=128,
        dtype=DType.BF16,
        fwd_time_s=fwd_s,
        fwd_bwd_time_s=fwd_bwd_s,
    )
    records = (*cluster.device.op_records, record)
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"op_records": records})})


@pytest.mark.parametrize(("ep", "micro_batch"), sorted(V2_ESTIMATES))
def test_a_version_2_profile_prices_moe_layers_as_it_did(ep: int, micro_batch: int) -> None:
    cluster = load_cluster(str(V2_TINY_MOE))
    assert cluster.schema_version == 12 and not any(r.op is OpKind.MOE_LAYER for r in cluster.device.op_records)
    got = estimate(TINY_MOE, TRAINING, cluster, _layout(ep, micro_batch))
    expected = V2_ESTIMATES[ep, micro_batch]
    assert (got.step_time_s, got.time.compute_s, got.peak_memory_bytes) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("ep", [1, 2])
def test_the_measured_moe_layer_is_the_layer_time(ep: int) -> None:
    # tiny-moe: 4 MoE layers, dp 2, micro-batch 2, 32 / (2 x 2) = 8 micro-batches per rank. A
    # record of 10 ms forward and 30 ms forward + backward prices each layer's micro-batch at
    # 10 ms + 20 ms; 50 ms + 150 ms instead adds 4 layers x 8 micro-batches x 120 ms to the
    # compute. At ep 2 the same record stands for the layer (routing uniform: no hot rank); the
    # all-to-alls stay apart, in expert-parallel comm.
    base = load_cluster(str(V2_TINY_MOE))
    layout = _layout(ep, 2)
    small = estimate(TINY_MOE, TRAINING, _with_moe_layer(base, 10e-3, 30e-3), layout)
    large = estimate(TINY_MOE, TRAINING, _with_moe_layer(base, 50e-3, 150e-3), layout)
    assert large.time.compute_s - small.time.compute_s == pytest.approx(4 * 8 * (150e-3 - 30e-3), rel=1e-9)
    assert large.stages[0].compute_per_micro_batch_s - small.stages[0].compute_per_micro_batch_s == pytest.approx(
        4 * (150e-3 - 30e-3), rel=1e-9
    )
    assert large.time.expert_parallel_comm_s == small.time.expert_parallel_comm_s
    assert (small.time.expert_parallel_comm_s > 0) == (ep > 1)
    # The rest of the micro-batch's compute (embedding, output layer, gradient accumulation)
    # is what the version-2 estimate spends beyond its 4 modeled MoE layers.
    old = estimate(TINY_MOE, TRAINING, base, layout)
    assert small.stages[0].compute_per_micro_batch_s - 4 * 30e-3 < old.stages[0].compute_per_micro_batch_s


def test_the_measured_moe_layer_is_read_between_micro_batch_sizes() -> None:
    # Records at micro-batch 1 (10 + 20 ms) and 4 (40 + 80 ms): micro-batch 2 is on the line
    # between them, 20 + 40 ms, as for the dense layer record.
    base = load_cluster(str(V2_TINY_MOE))
    two = estimate(TINY_MOE, TRAINING, _with_moe_layer(base, 20e-3, 60e-3), _layout(1, 2))
    line = _with_moe_layer(_with_moe_layer(base, 10e-3, 30e-3, micro_batch=1), 40e-3, 120e-3, micro_batch=4)
    assert estimate(TINY_MOE, TRAINING, line, _layout(1, 2)).step_time_s == pytest.approx(two.step_time_s, rel=1e-9)
