"""Experts folded over a stage's d t ranks (expert tensor parallelism 1 under t > 1, Megatron-Core's
MoE parallel folding): each term worked by hand on tiny-moe, against the same layout with every
expert split over t; and expert tensor parallelism t, the default, prices exactly what it did
before the option existed.

tiny-moe: h 128, 4 layers, all MoE, 4 SwiGLU experts of width f 256 (3 h f = 98,304 parameters
each), top-2, no shared experts, no dropout. FOLDED is dp2 tp2 ep2 with sequence parallelism:
4 ranks, expert-parallel groups (0, 1) and (2, 3), each rank 2 whole experts, the ranks at the
same place of the two groups (0, 2) and (1, 3) holding the same ones. SPLIT is the same degrees
with every expert split over t: ep 2 over the 2 replicas, each rank half of 2 experts.
"""

from dataclasses import replace

import pytest
from conftest import make_cluster

from cost_models.activations import layer_activations
from cost_models.comm import Group, collective_time_s
from cost_models.communication_buffers import communication_buffer_bytes
from cost_models.compute import Gemm
from cost_models.data_parallel import stage_data_parallel_comm
from cost_models.estimate import estimate
from cost_models.expert_parallel import expert_parallel_layer_s, routed_pairs
from cost_models.groups import expert_groups
from cost_models.layer_work import expert_gemms, layer_work
from cost_models.params import stage_params
from cost_models.sharding import optimizer_shard_params, stage_model_states
from cost_models.stage_activations import stage_activation_bytes
from cost_models.tensor_parallel import moe_layer_share
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import CollectiveOp, DType, Kernels, Layout, PipelineBuffers, TrainingSpec, precision_of
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.layout import check_experts

MODEL = load_model("tiny-moe")
TRAINING = TrainingSpec(global_batch_size=8, seq_len=64)
EXPERT = 3 * 128 * 256
FOLDED = Layout(
    data_parallel_degree=2,
    tensor_parallel_degree=2,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    expert_parallel_degree=2,
    expert_tensor_parallel_degree=1,
    sequence_parallel=True,
    zero_stage=1,
)
SPLIT = replace(FOLDED, expert_tensor_parallel_degree=None)


def test_a_folded_rank_holds_whole_experts_sharded_over_the_ranks_that_share_them() -> None:
    assert stage_params(MODEL, FOLDED, 0).expert == 4 * 2 * EXPERT  # 4 layers x E/ep = 2 whole experts
    assert stage_params(MODEL, SPLIT, 0).expert == 4 * 2 * EXPERT / 2  # ... each split over t = 2
    assert stage_params(MODEL, FOLDED, 0).dense == stage_params(MODEL, SPLIT, 0).dense
    assert (FOLDED.expert_data_parallel_degree, SPLIT.expert_data_parallel_degree) == (2, 1)  # d t / ep, d / ep
    dense = stage_params(MODEL, FOLDED, 0).dense
    # ZeRO-1: the optimizer steps 1/d of the dense parameters and 1/(d t / ep) of the experts'
    assert optimizer_shard_params(stage_params(MODEL, FOLDED, 0), FOLDED) == dense / 2 + 4 * 2 * EXPERT / 2
    assert optimizer_shard_params(stage_params(MODEL, SPLIT, 0), SPLIT) == dense / 2 + 4 * EXPERT
    folded = stage_model_states(MODEL, FOLDED, stage_params(MODEL, FOLDED, 0), precision_of(DType.BF16))
    split = stage_model_states(MODEL, SPLIT, stage_params(MODEL, SPLIT, 0), precision_of(DType.BF16))
    assert folded.weights_bytes - split.weights_bytes == 2 * 4 * EXPERT  # bf16 weights, twice the experts
    assert folded.optimizer_states_bytes == split.optimizer_states_bytes  # 12 x 8E / 2 against 12 x 4E / 1


def test_a_folded_rank_routes_its_own_share_of_the_sequence() -> None:
    assert routed_pairs(MODEL, TRAINING, FOLDED) == 2 * 64 // 2  # k s b / t
    assert routed_pairs(MODEL, TRAINING, SPLIT) == 2 * 64
    # the router sees the rank's 32 tokens; the experts 32 x k x ep / E = 32 pairs each, whole (f = 256)
    assert layer_work(MODEL, TRAINING, FOLDED).dense_gemms[2] == Gemm(32, 4, 128, linear=False)
    assert expert_gemms(MODEL, TRAINING, FOLDED) == (
        Gemm(32, 512, 128, batch=2, grouped=True),
        Gemm(32, 128, 256, batch=2, grouped=True),
    )
    # split: all 64 tokens, 64 pairs an expert, half its width
    assert expert_gemms(MODEL, TRAINING, SPLIT) == (
        Gemm(64, 256, 128, batch=2, grouped=True),
        Gemm(64, 128, 128, batch=2, grouped=True),
    )
    assert sum(g.flop for g in expert_gemms(MODEL, TRAINING, FOLDED)) == sum(
        g.flop for g in expert_gemms(MODEL, TRAINING, SPLIT)
    )


def test_the_folded_all_to_all_moves_a_ranks_own_pairs_inside_its_node() -> None:
    """dp4 tp2 ep4 on 2 nodes of 4 (100 GB/s inside, 10 GB/s between, 1 us a hop), s = 4096.
    Folded, a group is 4 consecutive ranks (one node) and each rank sends its k s / t = 4096 pairs
    of h = 128 bf16 elements, 1 MiB; split, a group is 4 replicas t = 2 apart (two nodes) and each
    rank sends k s = 8192 pairs, 2 MiB."""
    cluster = make_cluster(nodes=2, per_node=4)
    training = TrainingSpec(global_batch_size=8, seq_len=4096)
    folded = replace(FOLDED, data_parallel_degree=4, expert_parallel_degree=4)
    split = replace(folded, expert_tensor_parallel_degree=None)
    assert [tuple(g.devices) for g in expert_groups(folded)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [tuple(g.devices) for g in expert_groups(split)] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    one_node = 3 * 1e-6 + 3 / 4 * 2**20 / 100e9  # ring steps and (n-1)/n of the buffer over NVLink
    two_nodes = 1e-6 + max(2 / 4 * 2**21 / 10e9, 1 / 4 * 2**21 / 100e9)  # half the buffer off the node
    assert collective_time_s(CollectiveOp.ALL_TO_ALL, 2**20, Group(range(4)), cluster) == pytest.approx(one_node)
    # dispatch and combine, forward and backward
    assert expert_parallel_layer_s(MODEL, training, cluster, folded, expert_groups(folded)) == pytest.approx(
        4 * one_node
    )
    assert expert_parallel_layer_s(MODEL, training, cluster, split, expert_groups(split)) == pytest.approx(
        4 * two_nodes
    )


def test_a_folded_moe_layer_keeps_attentions_tensor_parallel_collectives_only() -> None:
    """Sequence parallel: attention's all-gather and reduce-scatter, and the MLP's, of s b h each;
    folded, the MoE block's input and output stay sequence-sharded: attention's alone, half."""
    cluster = make_cluster(nodes=1, per_node=4)
    folded, split = (estimate(MODEL, TRAINING, cluster, x).time for x in (FOLDED, SPLIT))
    assert folded.tensor_parallel_comm_s == pytest.approx(0.5 * split.tensor_parallel_comm_s)
    assert split.tensor_parallel_comm_s > 0
    assert moe_layer_share(MODEL, FOLDED) == 0.5 and moe_layer_share(MODEL, SPLIT) == 1.0
    # shared experts are split over t as a dense MLP: they keep the MLP's collectives
    assert moe_layer_share(load_model("deepseek-v3"), FOLDED) == 1.0


def test_folded_expert_gradients_are_reduced_over_the_ranks_holding_the_same_experts() -> None:
    """No ZeRO, one node of 4 at 100 GB/s: split, each expert is on one rank only (d / ep = 1) and
    nothing reduces it; folded, ranks (0, 2) and (1, 3) all-reduce the 8 whole experts'
    gradients, summed in fp32 (the default under bf16), 4 x 786,432 bytes: 2 ring steps of 1 us
    and 2 (n-1)/n = 1 buffer over the link."""
    cluster = make_cluster(nodes=1, per_node=4)
    folded, split = (replace(x, zero_stage=0) for x in (FOLDED, SPLIT))
    extra = (
        stage_data_parallel_comm(MODEL, TRAINING, cluster, folded, 0, 4).total_s
        - stage_data_parallel_comm(MODEL, TRAINING, cluster, split, 0, 4).total_s
    )
    assert extra == pytest.approx(2e-6 + 4 * 4 * 2 * EXPERT / 100e9)
    # and the gradient buckets count them (fp32, below the 2 x 25 M cap)
    params = stage_params(MODEL, FOLDED, 0), stage_params(MODEL, SPLIT, 0)
    buffers = [communication_buffer_bytes(MODEL, TRAINING, x, p) for x, p in zip((FOLDED, SPLIT), params, strict=True)]
    assert buffers[0] - buffers[1] == 4 * 4 * 2 * EXPERT


def test_folded_routed_activations_are_the_ranks_own_copies_at_whole_width() -> None:
    """A folded rank keeps k (s b / t) = 64 routed copies (input and output, h = 128 each, and 3
    SwiGLU intermediates of f = 256), 2 bytes each: 64 x (2 x 128 + 3 x 256) x 2; plus the router's
    input and fp32 logits over its 32 tokens. A split rank keeps the same bytes: k s b = 128 copies
    of half the width (the formula's /t), the inputs and outputs sequence-sharded."""
    mlp = layer_activations(
        MODEL,
        seq_len=64,
        micro_batch_size=1,
        activation_dtype=DType.BF16,
        tensor_parallel_degree=2,
        sequence_parallel=True,
    ).mlp_bytes
    assert mlp == 64 * (2 * 128 + 3 * 256) * 2 + 32 * 128 * 2 + 32 * 4 * 4
    folded, split = (stage_activation_bytes(MODEL, TRAINING, x, 0, stage_params(MODEL, x, 0)) for x in (FOLDED, SPLIT))
    assert folded == split


# Estimates of MoE layouts by the planner before expert tensor parallelism was an option (commit 126bf63),
# re-frozen when overlapped data-parallel communication began to cost its slowdown and its edges
# (cost_models.overlap), and when the loss without a pipeline stopped counting a second transient copy of the
# logits (cost_models.loss_memory.loss_element_bytes), and when elementwise kernels began to pay their launches
# (cost_models.kernels); the memory when the gradient buckets took the precision gradients are summed in
# (bf16 here: 2 x 25 M elements of 2 bytes, 100 MB less), and when groups spanning nodes took NCCL's
# per-protocol latencies (cost_models.spanning_collectives, the presets' 2.7 us network hop), and when the
# dgx-h100 preset's GEMMs began to pay a per-tile cost beside their loop over k (MatmulModel.k_overhead),
# and the memory when an MLP's backward began to count its transient beside the activations held
# (cost_models.activations.mlp_backward_bytes; the pipelined rows): the default (expert tensor
# parallelism t) must keep pricing them exactly.
BEFORE = (
    (
        "mixtral-8x7b",
        "dgx-h100:2",
        dict(data_parallel_degree=8, tensor_parallel_degree=2, expert_parallel_degree=4, sequence_parallel=True),
        12.297632757910165,
        79413688576.0,
    ),
    (
        "mixtral-8x7b",
        "dgx-h100:2",
        dict(
            data_parallel_degree=4,
            tensor_parallel_degree=2,
            pipeline_parallel_degree=2,
            expert_parallel_degree=2,
            recompute="full",
        ),
        17.165053249748745,
        62404616448.0,
    ),
    (
        "deepseek-v3",
        "dgx-h100:32",
        dict(
            data_parallel_degree=8,
            tensor_parallel_degree=4,
            pipeline_parallel_degree=8,
            expert_parallel_degree=8,
            sequence_parallel=True,
            recompute="full",
        ),
        19.86713216320647,
        51130982656.0,
    ),
    (
        "qwen3-235b-a22b",
        "dgx-h100:32",
        dict(
            data_parallel_degree=8,
            tensor_parallel_degree=4,
            pipeline_parallel_degree=8,
            expert_parallel_degree=8,
            sequence_parallel=True,
            recompute="full",
            schedule="interleaved",
            virtual_stages=4,
        ),
        13.722251565373337,
        18433639808.0,  # 18722784640 before the rematerialized layer filled the loss freed before it
    ),
)


@pytest.mark.parametrize(("model", "cluster", "degrees", "step_s", "peak_bytes"), BEFORE)
def test_expert_tensor_parallelism_t_prices_what_it_did_before(
    model: str, cluster: str, degrees: dict[str, object], step_s: float, peak_bytes: float
) -> None:
    layout = Layout(**{"pipeline_parallel_degree": 1, "micro_batch_size": 1, "zero_stage": 1, **degrees})  # type: ignore[arg-type]
    # Pipeline transfers priced as they were then, not behind compute (TrainingSpec.pp_comm_overlap came
    # later), gradients summed in bf16 (TrainingSpec.grad_reduce_dtype came later) and the pipeline's receive
    # buffers per transfer (TrainingSpec.pipeline_buffers came later), with fused kernels (the default
    # before stacks; TrainingSpec.stack came later).
    training = TrainingSpec(
        global_batch_size=256,
        seq_len=4096,
        kernels=Kernels.FUSED,
        pp_comm_overlap=False,
        grad_reduce_dtype=DType.BF16,
        pipeline_buffers=PipelineBuffers.PER_TRANSFER,
    )
    for same in (layout, replace(layout, expert_tensor_parallel_degree=layout.tensor_parallel_degree)):
        est = estimate(load_model(model), training, load_cluster(cluster), same)
        assert (est.step_time_s, est.peak_memory_bytes) == (step_s, peak_bytes)


def test_folding_needs_a_mixture_of_experts() -> None:
    dense = replace(FOLDED, expert_parallel_degree=1)
    with pytest.raises(InfeasibleConfigError, match="expert_tensor_parallel_degree=1 needs a mixture-of-experts"):
        check_experts(load_model("tiny-gpt"), dense)
    with pytest.raises(InfeasibleConfigError, match="divides both 4 and data x tensor_parallel_degree=8: 1, 2, 4"):
        check_experts(MODEL, replace(FOLDED, data_parallel_degree=4, expert_parallel_degree=8))
