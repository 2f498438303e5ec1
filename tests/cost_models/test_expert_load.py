"""The busiest expert-parallel rank: hand-worked loads of a routing trace under a placement, and
what they do to the estimate's time and memory (cost_models.expert_parallel)."""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models import groups as grp
from cost_models.compute import backward_gemms_time_s, gemms_time_s
from cost_models.estimate import estimate
from cost_models.expert_parallel import (
    dropped_share,
    layer_loads,
    routed_pairs,
    sent_bytes_per_step,
    stage_expert_loads,
)
from cost_models.layer_work import expert_gemms
from cost_models.memory import stage_memory
from cost_models.params import expert_mlp_params, stage_params
from cost_models.timing import stage_times
from planner.files.models import load_model
from planner.schemas import DType, ExpertPlacement, Layout, RoutingStats, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.geometry import chunk_layers

MOE = load_model("tiny-moe")  # 4 MoE layers, 4 experts, top-2
TRAINING = TrainingSpec(global_batch_size=16, seq_len=64, dtype=DType.BF16)
CLUSTER = make_cluster(per_node=2)
# Every layer routes 40, 10, 30 and 20% of its pairs to experts 0-3.
COUNTS = [[40, 10, 30, 20]] * 4


def _stats(counts: list[list[int]] = COUNTS) -> RoutingStats:
    return RoutingStats.from_counts(
        model=MOE.name,
        expert_tokens=counts,
        coactivation=[[[0] * 4] * 4] * (len(counts) - 1),
        experts_per_token=2,
        routed_tokens=50,
    )


def _layout(placement: ExpertPlacement | None = None, ep: int = 2, **kw: object) -> Layout:
    base = Layout(data_parallel_degree=2, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=2)
    return replace(base, expert_parallel_degree=ep, expert_placement=placement, **kw)  # type: ignore[arg-type]


def _slots(*ranks: tuple[int, ...]) -> ExpertPlacement:
    return ExpertPlacement(slots=(tuple(ranks),) * 4)


def test_contiguous_blocks_balance_this_trace() -> None:
    # rank 0 hosts {0, 1}: 50% of the pairs, rank 1 {2, 3}: 50%; each keeps half its own pairs.
    (load, *_) = layer_loads(MOE, TRAINING, _layout(), _stats())
    assert (load.compute_factor, load.exchange_factor, load.sent_share) == pytest.approx((1.0, 1.0, 0.5))


def test_round_robin_makes_a_hot_rank() -> None:
    # rank 0 hosts {0, 2}: 70% of the group's pairs, L = 2 x 0.7 = 1.4 P; it keeps 0.7 P of its own,
    # sends 0.3 P and receives 1.4 - 0.7 = 0.7 P; rank 1 sends 0.7 P. Balanced: 0.5 P each way.
    (load, *_) = layer_loads(MOE, TRAINING, _layout(_slots((0, 2), (1, 3))), _stats())
    assert (load.compute_factor, load.exchange_factor, load.sent_share) == pytest.approx((1.4, 1.4, 0.5))


def test_replicas_cut_load_and_traffic() -> None:
    # rank 0 hosts (0, 1, 2), rank 1 (3, 2, 0): experts 0 and 2 have two copies.
    # L0 = 2 (0.4/2 + 0.1 + 0.3/2) = 0.9, L1 = 2 (0.2 + 0.15 + 0.2) = 1.1; kept K0 = 0.8, K1 = 0.9;
    # sent 0.2 / 0.1, received 0.1 / 0.2: busiest 0.2 against a balanced 0.5.
    (load, *_) = layer_loads(MOE, TRAINING, _layout(_slots((0, 1, 2), (3, 2, 0))), _stats())
    assert (load.compute_factor, load.exchange_factor, load.sent_share) == pytest.approx((1.1, 0.4, 0.15))


def test_without_a_trace_routing_is_uniform() -> None:
    assert {(x.compute_factor, x.exchange_factor) for x in layer_loads(MOE, TRAINING, _layout(), None)} == {(1.0, 1.0)}
    # replicas under uniform routing: rank 0 (0, 1, 2), rank 1 (3, 2, 0): L = 2 (1/8 + 1/4 + 1/8) = 1 on
    # both; each keeps 3/4 of its own pairs and sends and receives 1/4, half a balanced rank's 1/2.
    (load, *_) = layer_loads(MOE, TRAINING, _layout(_slots((0, 1, 2), (3, 2, 0))), None)
    assert (load.compute_factor, load.exchange_factor, load.sent_share) == pytest.approx((1.0, 0.5, 0.25))
    assert layer_loads(MOE, TRAINING, _layout(ep=1), _stats()) == layer_loads(MOE, TRAINING, _layout(ep=1), None)


def _capacity(factor: float, padded: bool = False) -> TrainingSpec:
    return TRAINING.model_copy(update={"moe_capacity_factor": factor, "moe_pad_to_capacity": padded})


def test_a_capacity_factor_drops_the_hot_experts_pairs() -> None:
    # c = 1: each rank sends expert e at most 1/4 of its pairs: shares 0.25, 0.1, 0.25, 0.2 (N = 0.8).
    # Round robin: rank 0 hosts {0, 2}: L0 = 2 x 0.5 = 1.0 P, keeps 0.5, sends 0.8 - 0.5 = 0.3 and
    # receives 1.0 - 0.5 = 0.5; rank 1 {1, 3}: L1 = 0.6, keeps 0.3, sends 0.5. Busiest 0.5 of a balanced 0.5.
    (load, *_) = layer_loads(MOE, _capacity(1.0), _layout(_slots((0, 2), (1, 3))), _stats())
    assert (load.compute_factor, load.exchange_factor, load.sent_share, load.dropped_share) == pytest.approx(
        (1.0, 1.0, 0.4, 0.2)
    )
    assert dropped_share(MOE, _capacity(1.0), _stats()) == pytest.approx(0.2)
    assert dropped_share(MOE, _capacity(1.0), None) == dropped_share(MOE, TRAINING, _stats()) == 0.0
    # a generous factor drops nothing: the dropless loads
    roomy = layer_loads(MOE, _capacity(2.0), _layout(_slots((0, 2), (1, 3))), _stats())
    assert roomy == layer_loads(MOE, TRAINING, _layout(_slots((0, 2), (1, 3))), _stats())


def test_padding_to_capacity_computes_and_sends_the_full_capacity() -> None:
    # c = 1.25 padded: every expert takes 1.25/4 of each rank's pairs, whatever the routing.
    for routing in (_stats(), None):
        (load, *_) = layer_loads(MOE, _capacity(1.25, padded=True), _layout(), routing)
        assert (load.compute_factor, load.exchange_factor, load.sent_share, load.dropped_share) == pytest.approx(
            (1.25, 1.25, 0.625, 0.0)
        )
    # without expert parallelism the experts still compute the padding
    (alone, *_) = layer_loads(MOE, _capacity(1.25, padded=True), _layout(ep=1), None)
    assert alone.compute_factor == pytest.approx(1.25)


def test_capacity_prices_the_expert_work() -> None:
    layout = _layout()
    kw = {"tensor_groups": list(grp.tensor_groups(layout)), "expert_groups": list(grp.expert_groups(layout))}
    (padded,) = stage_times(MOE, _capacity(1.25, padded=True), CLUSTER, layout, **kw)  # type: ignore[arg-type]
    (dropless,) = stage_times(MOE, TRAINING, CLUSTER, layout, **kw)  # type: ignore[arg-type]
    assert padded.expert_parallel_comm_s == pytest.approx(1.25 * dropless.expert_parallel_comm_s)
    gemms = expert_gemms(MOE, TRAINING, layout)
    dev = CLUSTER.device
    extra = 4 * 0.25 * (gemms_time_s(gemms, dev, DType.BF16) + backward_gemms_time_s(gemms, dev, DType.BF16))
    assert padded.compute_s - dropless.compute_s == pytest.approx(extra)


def test_padding_needs_a_capacity_factor() -> None:
    with pytest.raises(SchemaError, match="needs a moe_capacity_factor"):
        TrainingSpec(global_batch_size=16, seq_len=64, moe_pad_to_capacity=True)


def test_a_trace_of_another_shape_is_refused() -> None:
    with pytest.raises(SchemaError, match="use a trace of this model"):
        layer_loads(MOE, TRAINING, _layout(), _stats([[40, 10, 30, 20]] * 3))


def test_the_hot_rank_sets_the_stage_time() -> None:
    placed, plain = _layout(_slots((0, 2), (1, 3))), _layout()
    kw = {"tensor_groups": list(grp.tensor_groups(plain)), "expert_groups": list(grp.expert_groups(plain))}
    (hot,) = stage_times(MOE, TRAINING, CLUSTER, placed, routing=_stats(), **kw)  # type: ignore[arg-type]
    (even,) = stage_times(MOE, TRAINING, CLUSTER, placed, **kw)  # type: ignore[arg-type]
    # all-to-all: 4 layers at 1.4 times the balanced exchange
    assert hot.expert_parallel_comm_s == pytest.approx(1.4 * even.expert_parallel_comm_s)
    # experts: 4 layers x 0.4 extra balanced expert GEMM forward + backward
    gemms = expert_gemms(MOE, TRAINING, placed)
    extra = (
        4
        * 0.4
        * (gemms_time_s(gemms, CLUSTER.device, DType.BF16) + backward_gemms_time_s(gemms, CLUSTER.device, DType.BF16))
    )
    assert hot.compute_s - even.compute_s == pytest.approx(extra)
    assert hot.backward_s > even.backward_s and hot.recompute_s == even.recompute_s == 0.0


def test_a_balanced_placement_beats_a_hot_one_in_the_estimate() -> None:
    stats = _stats()
    hot = estimate(MOE, TRAINING, CLUSTER, _layout(_slots((0, 2), (1, 3))), routing=stats)
    even = estimate(MOE, TRAINING, CLUSTER, _layout(_slots((0, 1), (2, 3))), routing=stats)
    assert hot.step_time_s > even.step_time_s
    assert hot.peak_memory_bytes > even.peak_memory_bytes  # the hot rank keeps more routed activations


def test_replica_slots_hold_their_experts() -> None:
    # 3 slots per rank instead of E / ep = 2: half as many expert parameters again, per MoE layer.
    two, three = _layout(_slots((0, 1), (2, 3))), _layout(_slots((0, 1, 2), (3, 2, 0)))
    extra = stage_params(MOE, three, 0).expert - stage_params(MOE, two, 0).expert
    assert extra == pytest.approx(4 * expert_mlp_params(MOE))
    assert (
        stage_memory(MOE, TRAINING, CLUSTER, three, 0).weights_bytes
        > stage_memory(MOE, TRAINING, CLUSTER, two, 0).weights_bytes
    )


def test_sent_bytes_per_step() -> None:
    # P = 2 x 64 x 2 = 256 pairs; half leave the rank; 4 exchanges, 4 layers, 8 micro-batches, 128 x 2 bytes a pair.
    layout = _layout()
    assert routed_pairs(MOE, TRAINING, layout) == 256
    assert sent_bytes_per_step(MOE, TRAINING, layout, 8, _stats()) == pytest.approx((256 * 0.5 * 4 * 4 * 8 * 256,))
    assert sent_bytes_per_step(MOE, TRAINING, _layout(ep=1), 8) == (0.0,)


def test_pipeline_stages_sum_their_own_layers() -> None:
    # layers 0-1 on stage 0 and 2-3 on stage 1; hot rank only in layers 2 and 3
    counts = [[25, 25, 25, 25]] * 2 + [[40, 10, 30, 20]] * 2
    layout = replace(_layout(_slots((0, 2), (1, 3))), pipeline_parallel_degree=2, data_parallel_degree=2)
    first, second = stage_expert_loads(MOE, TRAINING, layout, _stats(counts))
    assert (first.moe_layers, first.compute_sum, first.compute_max) == (2, pytest.approx(2.0), pytest.approx(1.0))
    assert (second.compute_sum, second.exchange_sum, second.compute_max) == pytest.approx((2.8, 2.8, 1.4))


def test_a_measured_layer_gets_the_moe_layers_extra_work() -> None:
    # The profiler times a layer with a dense MLP (here 1 ms forward, 2 ms backward); an MoE layer
    # adds the modeled difference of its router, experts and routing over that dense MLP.
    from cost_models.layer_time import _layer_time

    layout = _layout(ep=1)
    dense, moe = (_layer_time(MOE, TRAINING, CLUSTER, layout, None, moe=kind) for kind in (False, True))
    assert moe.forward_s > dense.forward_s and moe.backward_s > dense.backward_s
    timed_dense = _layer_time(MOE, TRAINING, CLUSTER, layout, (1e-3, 2e-3), moe=False)
    timed_moe = _layer_time(MOE, TRAINING, CLUSTER, layout, (1e-3, 2e-3), moe=True)
    assert (timed_dense.forward_s, timed_dense.backward_s) == (1e-3, 2e-3)
    assert timed_moe.forward_s == pytest.approx(1e-3 + moe.forward_s - dense.forward_s)
    assert timed_moe.backward_s == pytest.approx(2e-3 + moe.backward_s - dense.backward_s)


def test_stage_loads_are_their_layers_loads_over_every_split() -> None:
    # Layer 0 dense (first_k_dense_replace) and each MoE layer routed its own way; each stage's
    # loads are its chunks' layers' loads, summed or maxed, for pipelines, interleaving and
    # uneven splits, asked twice (the second from the memo) and for two placements.
    model = MOE.model_copy(update={"first_k_dense_replace": 1})
    counts = [[10 * (i + 1), 20, 30, 40 - i] for i in range(model.num_moe_layers)]
    routing = RoutingStats.from_counts(
        model=model.name,
        expert_tokens=counts,
        coactivation=[[[0] * 4] * 4] * (len(counts) - 1),
        experts_per_token=2,
        routed_tokens=sum(counts[0]) // 2,
    )
    moe_layers = [i for i in range(model.num_hidden_layers) if model.is_moe_layer(i)]
    splits = [dict(), dict(pipeline_parallel_degree=2), dict(pipeline_parallel_degree=2, layer_split=(3, 1))]
    splits += [dict(pipeline_parallel_degree=2, virtual_stages=2, schedule="interleaved")]
    for placement in (None, ExpertPlacement.round_robin(4, 2, model.num_moe_layers)):
        for split in splits:
            layout = Layout(
                data_parallel_degree=2,
                tensor_parallel_degree=1,
                micro_batch_size=1,
                expert_parallel_degree=2,
                expert_placement=placement,
                **{"pipeline_parallel_degree": 1, **split},  # type: ignore[arg-type]
            )
            loads = dict(zip(moe_layers, layer_loads(model, TRAINING, layout, routing), strict=True))
            first, stages = 0, {}
            for chunk, n in enumerate(chunk_layers(model, layout)):
                stages.setdefault(chunk % layout.pipeline_parallel_degree, []).extend(range(first, first + n))
                first += n
            for _ in range(2):
                got = stage_expert_loads(model, TRAINING, layout, routing)
                for stage, held in enumerate(got):
                    mine = [loads[i] for i in stages[stage] if i in loads]
                    assert held.moe_layers == len(mine), (split, stage)
                    assert held.compute_sum == pytest.approx(sum(x.compute_factor for x in mine))
                    assert held.exchange_sum == pytest.approx(sum(x.exchange_factor for x in mine))
                    assert held.compute_max == max((x.compute_factor for x in mine), default=1.0)
                    assert held.sent_pairs_share == pytest.approx(sum(x.sent_share for x in mine))
