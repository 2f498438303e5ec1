"""A measured tensor-parallel layer (``LayerRecord`` of op ``TP_LAYER``) was timed on every group
of t consecutive devices; where links differ, groups elsewhere are priced by the difference the
link model sees between theirs and those (``cost_models.tensor_parallel``)."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.comm import Group
from cost_models.tensor_parallel import tensor_parallel_layer_s
from planner.files.models import load_model
from planner.schemas import (
    ClusterProfile,
    DeviceMap,
    DType,
    LayerRecord,
    Layout,
    LinkMatrix,
    OpKind,
    TrainingSpec,
)

TINY = load_model("tiny-gpt")  # hidden 128
TRAINING = TrainingSpec(global_batch_size=8, seq_len=128, dtype=DType.BF16)
LAYOUT = Layout(data_parallel_degree=2, tensor_parallel_degree=2, pipeline_parallel_degree=1, micro_batch_size=4)
ACT_BYTES = 4 * 128 * 128 * 2  # b s h in bf16: 131,072
LOCAL = (1e-3, 2e-3)
"""The local layer's forward and backward (the record of op LAYER would say the same)."""
FAST_PAIR_S = 6.6e-6 + 2 * 5e-6 + ACT_BYTES / 5e9
"""An all-reduce of ACT_BYTES between 2 nodes at 10 GB/s: NCCL's LL ring (base 6.6 us, 2 network
hops of 5 us with one member a node, half the bandwidth)."""
SLOW_PAIR_S = 14e-6 + 2 * 8.5e-6 + ACT_BYTES / 0.92e9
"""The same at 1 GB/s: NCCL's LL128 ring (base 14 us, 2 hops of 8.5 us, 0.92 of the bandwidth)."""


def _hosts(slow_pair: tuple[int, int] | None) -> ClusterProfile:
    """4 nodes of 1 device at 10 GB/s and no latency, one pair at 1 GB/s; a real tp2 layer of
    tiny-gpt timed at 5 ms forward, 8 ms backward (4 and 6 ms beyond the local layer)."""
    bw = [[0.0 if i == j else 10e9 for j in range(4)] for i in range(4)]
    if slow_pair is not None:
        a, b = slow_pair
        bw[a][b] = bw[b][a] = 1e9
    base = make_cluster(nodes=4, per_node=1, latency_s=0.0)
    record = LayerRecord(
        op=OpKind.TP_LAYER,
        model=TINY.name,
        tensor_parallel_degree=2,
        micro_batch_size=4,
        seq_len=128,
        sequence_parallel=False,
        dtype=DType.BF16,
        fwd_time_s=5e-3,
        fwd_bwd_time_s=13e-3,
    )
    links = LinkMatrix(size=4, bandwidth_bytes_per_s=bw, latency_s=[[0.0] * 4 for _ in range(4)])
    device = base.device.model_copy(update={"op_records": (record,)})
    return base.model_copy(update={"inter_node_links": links, "device": device})


def _tp_s(cluster: ClusterProfile, groups: tuple[tuple[int, int], ...], devices: tuple[int, ...] = ()) -> float:
    layout = replace(LAYOUT, device_map=DeviceMap(devices=devices))
    return tensor_parallel_layer_s(TINY, TRAINING, cluster, layout, [Group(g) for g in groups], LOCAL)


def test_groups_off_the_slowed_pair_it_was_timed_across_are_priced_faster() -> None:
    timed_across_slow = _hosts(slow_pair=(0, 1))
    # On the groups it was timed on, the record as measured: 4 + 6 ms beyond the local layer.
    assert _tp_s(timed_across_slow, ((0, 1), (2, 3))) == pytest.approx(10e-3)
    # Groups (2, 1) and (0, 3) run at 10 GB/s: each pass's 2 all-reduces of a 2-member ring (1x
    # the buffer each) run as NCCL's tuner picks, LL at 10 GB/s, LL128 at 1 GB/s: 261.3 us less a pass.
    gain_s = 2 * (SLOW_PAIR_S - FAST_PAIR_S)
    mapped = _tp_s(timed_across_slow, ((2, 1), (0, 3)), devices=(2, 1, 0, 3))
    assert mapped == pytest.approx(10e-3 - 2 * gain_s)


def test_a_record_timed_on_fast_groups_prices_groups_across_the_slow_pair_slower() -> None:
    timed_fast = _hosts(slow_pair=(1, 2))  # the timed groups (0, 1), (2, 3) avoid it
    loss_s = 2 * (SLOW_PAIR_S - FAST_PAIR_S)
    assert _tp_s(timed_fast, ((0, 1), (2, 3))) == pytest.approx(10e-3)
    assert _tp_s(timed_fast, ((1, 2), (0, 3)), devices=(1, 2, 0, 3)) == pytest.approx(10e-3 + 2 * loss_s)


def test_uniform_links_keep_the_record_as_measured() -> None:
    uniform = make_cluster(nodes=4, per_node=1, latency_s=0.0)
    device = _hosts(None).device
    cluster = uniform.model_copy(update={"device": device})
    assert _tp_s(cluster, ((0, 2), (1, 3)), devices=(0, 2, 1, 3)) == pytest.approx(10e-3)
