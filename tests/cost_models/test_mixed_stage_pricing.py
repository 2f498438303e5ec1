"""On a cluster of mixed device types each pipeline stage is priced on its own ranks' devices
(the slowest among them), and the layer split gives the faster stage more layers: a hand-built
two-node cluster whose node 1 runs every kernel 3 times faster (3x the FLOP/s and the memory
bandwidth) checks both by hand; where both types run alike, the mixed cluster prices exactly as
a uniform one, whatever the layout."""

from dataclasses import replace

import pytest
from conftest import make_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import groups as grp
from cost_models.estimate import estimate
from cost_models.stage_devices import stage_devices, uniformly_slowest
from cost_models.timing import StageTime, stage_times
from planner.files.models import load_model
from planner.schemas import ClusterProfile, DeviceMap, DeviceProfile, DType, Layout, NodeOverride, TrainingSpec
from planner.schemas.settings import Budget
from planner.search_engine.evaluate import Evaluator, SplitCosts
from planner.search_engine.layer_split import balance_layers

SPEEDUP = 3.0
MODEL = load_model("llama3-8b")  # 32 layers
TRAINING = TrainingSpec(global_batch_size=32, seq_len=2048, dtype=DType.BF16)
SLOW = make_cluster(nodes=2, per_node=4)
PP2 = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)


def _faster(device: DeviceProfile, factor: float, name: str) -> DeviceProfile:
    return device.model_copy(
        update={
            "name": name,
            "peak_flop_per_s": {dt: rate * factor for dt, rate in device.peak_flop_per_s.items()},
            "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s * factor,
        }
    )


def _mixed(factor: float = SPEEDUP) -> ClusterProfile:
    """``SLOW`` with node 1's devices ``factor`` times as fast."""
    fast = _faster(SLOW.device, factor, "fast-gpu")
    return ClusterProfile.model_validate({**dict(SLOW), "node_overrides": (NodeOverride(nodes=(1,), device=fast),)})


def _times(cluster: ClusterProfile, layout: Layout) -> tuple[StageTime, ...]:
    return stage_times(
        MODEL,
        TRAINING,
        cluster,
        layout,
        tensor_groups=grp.tensor_groups(layout),
        expert_groups=grp.expert_groups(layout),
    )


def test_a_stage_runs_at_its_own_nodes_pace_and_one_spanning_both_at_the_slowest() -> None:
    mixed = _mixed()
    assert [d.name for d in stage_devices(mixed, PP2)] == ["test-gpu", "fast-gpu"]
    slow, priced = _times(SLOW, PP2), _times(mixed, PP2)
    assert priced[0] == slow[0]  # stage 0 on node 0 (slow devices), as before
    # stage 1 on node 1: every kernel 3x faster (GEMMs at 3x the FLOP/s, elementwise at 3x the bandwidth)
    assert priced[1].compute_s == pytest.approx(slow[1].compute_s / SPEEDUP, rel=1e-9)
    # ranks 0-3 on node 1 (the fast one): the stages swap devices
    swapped = replace(PP2, device_map=DeviceMap(devices=(4, 5, 6, 7, 0, 1, 2, 3)))
    assert [d.name for d in stage_devices(mixed, swapped)] == ["fast-gpu", "test-gpu"]
    # one stage over both nodes (pp 1, dp 8) runs in lockstep at the slow devices' pace
    whole = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    assert _times(mixed, whole) == _times(SLOW, whole)


def test_the_layer_split_follows_the_flop_rate_ratio_within_a_layer() -> None:
    mixed = _mixed()
    costs = Evaluator(MODEL, TRAINING, mixed).split_costs(PP2)
    slow = Evaluator(MODEL, TRAINING, SLOW).split_costs(PP2)
    per_layer_s, base_s = slow.time_per_layer_s[0], slow.time_base_s
    assert costs.time_per_layer_s[0] == pytest.approx(per_layer_s, rel=1e-9)
    assert costs.time_per_layer_s[1] == pytest.approx(per_layer_s / SPEEDUP, rel=1e-9)
    split = balance_layers(costs, MODEL.num_hidden_layers, 1e15, Budget(max_time_s=5.0))
    assert split is not None
    # Hand-worked: equal stage times, n0 t + b0 = (32 - n0) t / 3 + b1 / 3,
    # give n0 = (32 t / 3 + b1 / 3 - b0) / (4 t / 3);
    # without the embedding and output layer (b0 = b1 = 0) that is 32 / (1 + 3) = 8: the FLOP/s ratio.
    n0 = (MODEL.num_hidden_layers * per_layer_s / SPEEDUP + base_s[1] / SPEEDUP - base_s[0]) / (
        per_layer_s * (1 + 1 / SPEEDUP)
    )
    assert abs(split[0] - n0) <= 1.0 and split[0] + split[1] == MODEL.num_hidden_layers
    assert 6 <= split[0] <= 9  # about a quarter of the layers on the 3x slower stage
    balanced = _times(mixed, replace(PP2, layer_split=split))
    assert abs(balanced[0].total_s - balanced[1].total_s) <= per_layer_s  # within one (slow) layer


def test_the_mixed_aware_estimate_beats_pricing_every_rank_as_the_slowest() -> None:
    mixed = _mixed()
    layout = replace(PP2, layer_split=(8, 24))
    aware, homogeneous = estimate(MODEL, TRAINING, mixed, layout), estimate(MODEL, TRAINING, SLOW, layout)
    assert estimate(MODEL, TRAINING, uniformly_slowest(mixed), layout) == homogeneous
    assert aware.step_time_s < 0.5 * homogeneous.step_time_s
    # MFU divides by the ranks' own peaks: 4 at 100 and 4 at 300 TFLOP/s (bf16)
    assert aware.mfu == pytest.approx(homogeneous.mfu * homogeneous.step_time_s / aware.step_time_s / 2)


@settings(max_examples=30, deadline=None)
@given(
    degrees=st.sampled_from([(8, 1, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2), (2, 1, 4), (1, 1, 8), (1, 2, 4)]),
    swap=st.booleans(),
    micro_batch_size=st.sampled_from([1, 2]),
)
def test_types_that_run_alike_price_as_one_uniform_cluster(
    degrees: tuple[int, int, int], swap: bool, micro_batch_size: int
) -> None:
    """The new pricing equals the old wherever the devices do not differ in speed: a cluster of
    two device types that run alike prices every layout exactly as the uniform cluster."""
    d, t, p = degrees
    devices = DeviceMap(devices=(4, 5, 6, 7, 0, 1, 2, 3)) if swap else DeviceMap()
    layout = Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=micro_batch_size,
        device_map=devices,
    )
    alike = _mixed(factor=1.0)
    assert alike.has_mixed_devices
    assert estimate(MODEL, TRAINING, alike, layout) == estimate(MODEL, TRAINING, SLOW, layout)


def test_each_stage_fits_in_its_own_devices_memory() -> None:
    big = _faster(SLOW.device, SPEEDUP, "fast-gpu").model_copy(update={"memory_bytes": 2 * SLOW.device.memory_bytes})
    mixed = ClusterProfile.model_validate({**dict(SLOW), "node_overrides": (NodeOverride(nodes=(1,), device=big),)})
    evaluate = Evaluator(MODEL, TRAINING, mixed, memory_margin=0.0)
    assert evaluate.stage_usable_bytes(PP2) == (80 * 2**30, 160 * 2**30)
    whole = replace(PP2, data_parallel_degree=8, pipeline_parallel_degree=1)
    assert evaluate.stage_usable_bytes(whole) == (80 * 2**30,)  # one stage over both: the smaller memory
    # 8 layers of 1 s and 1 GiB each: the even split 4 + 4 is fastest, but stage 0 holds only 3 GiB.
    gib = float(2**30)
    costs = SplitCosts(
        time_base_s=(0.0, 0.0),
        time_per_layer_s=(1.0, 1.0),
        memory_base_bytes=(0.0, 0.0),
        memory_per_layer_bytes=(gib, gib),
    )
    assert balance_layers(costs, 8, (3 * gib, 100 * gib), Budget(max_time_s=5.0)) == (3, 5)
    assert balance_layers(costs, 8, 100 * gib, Budget(max_time_s=5.0)) == (4, 4)
