"""Sharding in groups (HSDP) and ZeRO-3's secondary partition (hpZ): the layout's rules, the
memory each holds and the collectives each runs, hand-worked on two nodes of four devices
(100 GB/s inside a node, 10 GB/s rails between nodes, 1 us a hop inside a node; ring model, no
records; groups spanning nodes as NCCL's tuner prices them: ``cost_models.spanning_collectives``)."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.data_parallel import stage_data_parallel_comm
from cost_models.estimate import estimate
from cost_models.params import stage_params
from cost_models.sharding import optimizer_shard_params, stage_model_states
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import DType, Layout, LinkMatrix, LinkProfile, TrainingSpec, ZeroStage, precision_of
from planner.schemas.errors import SchemaError

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=32, seq_len=128, grad_reduce_dtype=DType.BF16)  # summed in bf16
CLUSTER = make_cluster(nodes=2, per_node=4)
ZERO3 = Layout(
    data_parallel_degree=8,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.PARAMETERS,
)
MICRO_BATCHES = 32 // 8


def _ring(steps: int, volume: float, bandwidth: float) -> float:
    return steps * 1e-6 + volume / bandwidth


def test_the_layout_checks_its_groups() -> None:
    assert replace(ZERO3, sharding_group_size=8).sharding_group_size is None  # the whole group: the default
    assert replace(ZERO3, sharding_group_size=4, secondary_partition_size=2).describe() == (
        "dp8 tp1 pp1 mb1 zero3 hsdp4 hpz2 rc-none"
    )
    bad = [
        dict(sharding_group_size=3),  # does not divide d
        dict(sharding_group_size=4, zero_stage=ZeroStage.NONE),  # nothing to shard
        dict(secondary_partition_size=2, zero_stage=ZeroStage.GRADIENTS),  # no gathered weights
        dict(sharding_group_size=4, secondary_partition_size=4),  # not smaller than the group
        dict(secondary_partition_size=2, pipeline_parallel_degree=2),  # not modelled under a pipeline
    ]
    for change in bad:
        with pytest.raises(SchemaError) as raised:
            replace(ZERO3, **change)  # type: ignore[arg-type]
        assert "\n" not in str(raised.value)


def test_hsdp_keeps_zero3s_collectives_inside_a_node_and_all_reduces_a_quarter_across_once() -> None:
    held = stage_params(MODEL, ZERO3, 0)
    units, b = held.units, held.dense * 2 / held.units  # bf16 bytes of one unit
    # ZeRO-3 over 8 ranks on 2 nodes, every micro-batch: a reduce-scatter and two all-gathers of
    # each unit (383 kB), each one ring through the 8 in NCCL's LL protocol (its base 6.6 us, 6
    # NVLink hops at the 1 us network post overhead, 1 network hop of 2.7 us; 7/8 of the unit per
    # rank at half the bus bandwidth of each node's 4 rails at once: 40 GB/s, below the 100 GB/s
    # of a ring inside a node).
    spanning = 6.6e-6 + 6 * 1e-6 + 2.7e-6 + 0.875 * b / 20e9
    inside = _ring(3, 0.75 * b, 100e9)
    full = MICRO_BATCHES * units * 3 * spanning
    # HSDP in groups of 4 (one node each): those three inside the node; once a step each unit's
    # accumulated shard (1/4 of it) all-reduced between the 2 replicas across the nodes: a ring in
    # LL, 2 network hops at 5 us (one member a node: NCCL's tree figure), at half of 10 GB/s.
    hsdp = MICRO_BATCHES * units * 3 * inside + units * (6.6e-6 + 2 * 5e-6 + b / 4 / 5e9)
    got_full = stage_data_parallel_comm(MODEL, TRAINING, CLUSTER, ZERO3, 0, MICRO_BATCHES).total_s
    grouped = replace(ZERO3, sharding_group_size=4)
    got_hsdp = stage_data_parallel_comm(MODEL, TRAINING, CLUSTER, grouped, 0, MICRO_BATCHES).total_s
    assert got_full == pytest.approx(full, rel=1e-12)
    assert got_hsdp == pytest.approx(hsdp, rel=1e-12)


def test_a_secondary_partition_moves_the_backward_gather_inside_the_node() -> None:
    held = stage_params(MODEL, ZERO3, 0)
    units, b = held.units, held.dense * 2 / held.units
    spanning = 6.6e-6 + 6 * 1e-6 + 2.7e-6 + 0.875 * b / 20e9  # as above
    inside = _ring(3, 0.75 * b, 100e9)
    hpz = MICRO_BATCHES * units * (2 * spanning + inside)
    layout = replace(ZERO3, secondary_partition_size=4)
    got = stage_data_parallel_comm(MODEL, TRAINING, CLUSTER, layout, 0, MICRO_BATCHES).total_s
    assert got == pytest.approx(hpz, rel=1e-12)


def test_memory_of_each() -> None:
    held = stage_params(MODEL, ZERO3, 0)
    full = stage_model_states(MODEL, ZERO3, held, precision_of(DType.BF16))
    hsdp = stage_model_states(MODEL, replace(ZERO3, sharding_group_size=4), held, precision_of(DType.BF16))
    hpz = stage_model_states(MODEL, replace(ZERO3, secondary_partition_size=2), held, precision_of(DType.BF16))
    # optimizer states (12 bytes) and fp32 gradients (4) over 4 ranks instead of 8
    assert hsdp.optimizer_states_bytes == pytest.approx(2 * full.optimizer_states_bytes)
    assert hsdp.gradients_bytes == pytest.approx(2 * full.gradients_bytes)
    assert hsdp.weights_bytes == full.weights_bytes  # the gathered units only (the fp32 shard is the master)
    # hpZ keeps every unit's bf16 weights over 2 ranks from its forward to its backward
    assert hpz.weights_bytes - full.weights_bytes == pytest.approx(2 * held.dense / 2)
    assert optimizer_shard_params(held, replace(ZERO3, sharding_group_size=4)) == pytest.approx(held.dense / 4)


def test_hsdp_pays_where_nodes_are_far_apart() -> None:
    """Llama 3 8B on 4 DGX H100 nodes joined by 100 Gb/s per GPU (not the preset's 400), ZeRO-3
    over 32 ranks against HSDP in node-sized groups: the gathers leave the slow network, so the
    step is faster; the shards are 4 x larger. (Over the preset's eight 400 Gb/s rails a ring
    through all 32 runs about as fast as one inside a node: there HSDP saves nothing.)"""
    model, preset = load_model("llama3-8b"), load_cluster("dgx-h100:4")
    slow = LinkMatrix(size=4, uniform=LinkProfile(bandwidth_bytes_per_s=12e9, latency_s=5e-6))
    cluster = preset.model_copy(update={"inter_node_links": slow})
    training = TrainingSpec(global_batch_size=64, seq_len=4096)
    layout = Layout(
        data_parallel_degree=32,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
        recompute="full",  # type: ignore[arg-type]
    )
    full, hsdp = (estimate(model, training, cluster, x) for x in (layout, replace(layout, sharding_group_size=8)))
    assert hsdp.time.data_parallel_comm_s + hsdp.time.data_parallel_comm_overlapped_s < (
        full.time.data_parallel_comm_s + full.time.data_parallel_comm_overlapped_s
    )
    assert hsdp.peak_memory_bytes > full.peak_memory_bytes
