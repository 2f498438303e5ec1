"""Optimizer offload (``Layout.optimizer_offload_fraction``): the offloaded share of a rank's
optimizer shard leaves device memory for the host's, its step runs on the node's CPUs after its
gradients are copied down, and its weights come back; hand-worked on Llama 3 70B on one DGX H100."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.estimate import estimate
from cost_models.params import all_stage_params
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import HostProfile, Layout, Recompute, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError, SchemaError

LLAMA = load_model("llama3-70b")
NODE = load_cluster("dgx-h100:1")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=4096)
OFFLOADED = Layout(
    data_parallel_degree=8,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.PARAMETERS,
    recompute=Recompute.FULL,
    optimizer_offload_fraction=1.0,
)
KEPT = replace(OFFLOADED, optimizer_offload_fraction=0.0)


def _params(layout: Layout = KEPT) -> float:
    """Parameters one rank holds before ZeRO shards them."""
    (held,) = set(all_stage_params(LLAMA, layout))
    return held.dense + held.expert


def test_every_state_offloaded_leaves_the_device_for_the_host_by_hand() -> None:
    kept, offloaded = estimate(LLAMA, TRAINING, NODE, KEPT), estimate(LLAMA, TRAINING, NODE, OFFLOADED)
    shard = _params() / 8  # ZeRO-3 over 8 ranks
    before, after = kept.stages[0].memory, offloaded.stages[0].memory
    assert before.optimizer_states_bytes == pytest.approx(12 * shard)  # fp32 master and two moments
    assert after.optimizer_states_bytes == 0
    # the fp32 master was the shard's only copy: a bf16 copy of the weights stays on the device
    assert after.weights_bytes - before.weights_bytes == pytest.approx(2 * shard)
    assert after.host_bytes == pytest.approx(16 * shard)  # the states and an fp32 gradient
    assert before.host_bytes == 0 and kept.host_memory_per_node_bytes == 0
    assert offloaded.host_memory_per_node_bytes == pytest.approx(8 * 16 * shard)
    assert offloaded.host_memory_capacity_bytes == 2.0e12 and offloaded.fits_host


def test_the_offloaded_step_is_the_copies_and_the_nodes_cpu_adam_by_hand() -> None:
    kept, offloaded = estimate(LLAMA, TRAINING, NODE, KEPT), estimate(LLAMA, TRAINING, NODE, OFFLOADED)
    shard = _params() / 8
    copies_s = shard * 4 / 55e9 + shard * 2 / 55e9  # fp32 gradients down, bf16 weights up, 55 GB/s each
    cpu_s = 8 * shard / 10.2e9  # the node's 8 ranks share its CPUs' 10.2e9 parameters a second
    assert offloaded.time.optimizer_offload_s == pytest.approx(copies_s + cpu_s)
    assert offloaded.time.optimizer_s == 0 and kept.time.optimizer_offload_s == 0
    for name in ("compute_s", "recompute_s", "data_parallel_comm_s"):
        assert getattr(offloaded.time, name) == getattr(kept.time, name)
    assert offloaded.step_time_s == pytest.approx(
        kept.step_time_s - kept.time.optimizer_s + offloaded.time.optimizer_offload_s
    )


@settings(max_examples=20, deadline=None)
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
def test_device_memory_and_the_offloaded_step_are_linear_in_the_fraction(fraction: float) -> None:
    ends = [estimate(LLAMA, TRAINING, NODE, replace(KEPT, optimizer_offload_fraction=f)) for f in (0.0, 1.0)]
    between = estimate(LLAMA, TRAINING, NODE, replace(KEPT, optimizer_offload_fraction=fraction))
    low, high = (e.stages[0].memory for e in ends)
    mem = between.stages[0].memory
    assert mem.total_bytes == pytest.approx(low.total_bytes + fraction * (high.total_bytes - low.total_bytes))
    assert mem.host_bytes == pytest.approx(fraction * high.host_bytes)
    assert between.time.optimizer_offload_s == pytest.approx(fraction * ends[1].time.optimizer_offload_s)
    assert between.time.optimizer_s == pytest.approx((1 - fraction) * ends[0].time.optimizer_s)


def test_a_node_whose_host_is_too_small_does_not_fit_and_says_by_how_much() -> None:
    small = NODE.model_copy(update={"host": HostProfile(memory_bytes=500 * 10**9, adam_params_per_s=10.2e9)})
    est = estimate(LLAMA, TRAINING, small, OFFLOADED)
    assert est.peak_memory_bytes <= est.memory_capacity_bytes  # the devices have room
    assert not est.fits_host and not est.fits
    assert est.host_memory_per_node_bytes > 2 * est.host_memory_capacity_bytes


def test_a_slower_host_slows_only_the_offloaded_step() -> None:
    slow = NODE.model_copy(update={"host": HostProfile(memory_bytes=2 * 10**12, adam_params_per_s=5.1e9)})
    fast_est, slow_est = estimate(LLAMA, TRAINING, NODE, OFFLOADED), estimate(LLAMA, TRAINING, slow, OFFLOADED)
    cpu_s = 8 * _params() / 8 / 10.2e9
    assert slow_est.time.optimizer_offload_s - fast_est.time.optimizer_offload_s == pytest.approx(cpu_s)


def test_a_cluster_that_does_not_describe_its_hosts_cannot_price_an_offload() -> None:
    bare = NODE.model_copy(update={"host": None})
    with pytest.raises(InfeasibleConfigError, match=r"does not give its hosts' memory and CPU Adam rate"):
        estimate(LLAMA, TRAINING, bare, OFFLOADED)
    estimate(LLAMA, TRAINING, bare, KEPT)  # nothing offloaded: nothing to price


def test_the_layout_refuses_a_fraction_outside_0_to_1() -> None:
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(SchemaError, match=r"must be a number from 0"):
            replace(OFFLOADED, optimizer_offload_fraction=bad)
    assert "opt-offload0.25" in replace(OFFLOADED, optimizer_offload_fraction=0.25).describe()
    assert "offload" not in KEPT.describe()


def test_without_zero_each_rank_offloads_all_its_own_states() -> None:
    whole = replace(OFFLOADED, data_parallel_degree=1, tensor_parallel_degree=8, zero_stage=ZeroStage.NONE)
    est = estimate(LLAMA, TRAINING, NODE, whole)
    assert est.stages[0].memory.optimizer_states_bytes == 0
    assert est.stages[0].memory.host_bytes == pytest.approx(16 * _params(whole))  # all of a tp rank's
    assert est.fits  # Llama 3 70B on one node: tp 8, its optimizer on the host


def test_zero1_offload_keeps_the_weights_it_already_holds() -> None:
    zero1 = replace(OFFLOADED, zero_stage=ZeroStage.OPTIMIZER)
    kept = estimate(LLAMA, TRAINING, NODE, replace(zero1, optimizer_offload_fraction=0.0)).stages[0].memory
    half = estimate(LLAMA, TRAINING, NODE, replace(zero1, optimizer_offload_fraction=0.5)).stages[0].memory
    assert half.weights_bytes == kept.weights_bytes
    assert half.optimizer_states_bytes == pytest.approx(kept.optimizer_states_bytes / 2)


ZERO3_405B = Layout(
    data_parallel_degree=32,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.PARAMETERS,
    recompute=Recompute.FULL,
    optimizer_offload_fraction=1.0,
    parameter_offload=True,
)


def test_with_the_weights_offloaded_the_device_holds_only_what_it_gathers_by_hand() -> None:
    model, nodes = load_model("llama3-405b"), load_cluster("dgx-h100:4")
    offloaded = estimate(model, TRAINING, nodes, ZERO3_405B)
    states = estimate(model, TRAINING, nodes, replace(ZERO3_405B, parameter_offload=False))
    memory, before = offloaded.stages[0].memory, states.stages[0].memory
    assert memory.gradients_bytes == 0 and memory.optimizer_states_bytes == 0
    assert 0 < memory.weights_bytes < before.weights_bytes  # the gathered units alone
    (held,) = set(all_stage_params(model, ZERO3_405B))
    shard = (held.dense + held.expert) / 32
    assert memory.host_bytes == pytest.approx(16 * shard)  # fp32 master (the shard), moments, gradients
    assert offloaded.host_memory_per_node_bytes == pytest.approx(8 * 16 * shard)


def test_with_the_weights_offloaded_the_step_adds_the_copies_compute_does_not_hide_by_hand() -> None:
    model, nodes = load_model("llama3-405b"), load_cluster("dgx-h100:4")
    (held,) = set(all_stage_params(model, ZERO3_405B))
    shard = (held.dense + held.expert) / 32
    cpu_s = 8 * shard / 10.2e9
    one = estimate(model, TRAINING.model_copy(update={"global_batch_size": 32}), nodes, ZERO3_405B)
    # one micro-batch: its two unshards' fp32 copies (2 x 4 bytes a parameter at 55 GB/s, 1.2 s)
    # hide behind its compute; its gradients go down behind the backward
    assert one.time.optimizer_offload_s == pytest.approx(cpu_s)
    two = estimate(model, TRAINING, nodes, ZERO3_405B)  # two micro-batches: the second's gradients accumulate
    assert two.time.optimizer_offload_s == pytest.approx(cpu_s + shard * 4 / 55e9)


def test_the_layout_refuses_a_weight_offload_it_cannot_run() -> None:
    with pytest.raises(SchemaError, match=r"needs zero_stage=3 over more than one replica without a pipeline"):
        replace(ZERO3_405B, zero_stage=ZeroStage.OPTIMIZER)
    with pytest.raises(SchemaError, match=r"set it to 1"):
        replace(ZERO3_405B, optimizer_offload_fraction=0.5)
    assert "param-offload" in ZERO3_405B.describe() and "opt-offload" not in ZERO3_405B.describe()
