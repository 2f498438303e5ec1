"""Shared experts, dense first layers and multi-head latent attention in the parameter, FLOP,
activation and time models: hand-worked shapes and whole-model identities.

The parameter counts themselves are checked against transformers in test_params_transformers.py;
here the other models are tied to them (FLOPs = 6 x active matmul weights per token + attention
core; stage parameters sum to the total) and the per-rank splits are worked by hand.
"""

import pytest

from cost_models import groups as grp
from cost_models.activations import layer_activations
from cost_models.compute import Gemm
from cost_models.layer_work import layer_work, model_flops_per_sequence, profile_gemm_shapes
from cost_models.params import (
    active_params,
    attention_params,
    attention_replicated_params,
    embedding_params,
    layer_params,
    norm_params,
    stage_moe_layers,
    stage_params,
    total_params,
)
from cost_models.timing import stage_times
from planner.files.cluster_presets import cluster_preset
from planner.schemas import DType, Layout, ModelSpec, TrainingSpec

# DeepSeek-shaped, small: MLA with a query down-projection, one dense first layer, two shared experts.
DEEPSEEK = ModelSpec(
    name="deepseek-small",
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=96,
    moe_intermediate_size=16,
    vocab_size=256,
    hidden_act="silu",
    tie_word_embeddings=False,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=2,
    first_k_dense_replace=1,
    n_group=4,
    topk_group=2,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
)
# Qwen2-MoE-shaped: gated shared expert, a dense layer in the middle, q/k/v biases.
QWEN2 = ModelSpec(
    name="qwen2-small",
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=32,
    vocab_size=256,
    hidden_act="silu",
    tie_word_embeddings=False,
    num_local_experts=4,
    num_experts_per_tok=2,
    mlp_only_layers=(2,),
    qkv_bias=True,
    qk_norm=True,
)
TRAINING = TrainingSpec(global_batch_size=8, seq_len=32)


def _layout(t: int = 1, p: int = 1, d: int = 1, ep: int = 1) -> Layout:
    return Layout(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        expert_parallel_degree=ep,
        micro_batch_size=2,
    )


def test_mla_parameters_by_hand() -> None:
    # q_a 64x24 + norm 24 + q_b 24x(4*24); kv_a 64x(32+8) + norm 32 + kv_b 32x4*(16+12); o 4*12 x 64.
    expected = 64 * 24 + 24 + 24 * 96 + 64 * 40 + 32 + 32 * 4 * 28 + 48 * 64
    assert attention_params(DEEPSEEK) == expected
    # Down-projections and their norms stay whole on every tensor-parallel rank.
    assert attention_replicated_params(DEEPSEEK) == 64 * 24 + 24 + 64 * 40 + 32
    on_two = layer_params(DEEPSEEK, tensor_parallel_degree=2, moe=False).attention
    assert on_two == (24 * 96 + 32 * 4 * 28 + 48 * 64) / 2 + 64 * 24 + 24 + 64 * 40 + 32


def test_moe_layer_parameters_split_routed_experts_over_ep_and_shared_experts_over_tp() -> None:
    layer = layer_params(DEEPSEEK, tensor_parallel_degree=2, expert_parallel_degree=4, moe=True)
    assert layer.mlp == 8 / 4 * 3 * 64 * 16 / 2  # two experts of 3 h x 16 matrices, halves
    assert layer.shared == 3 * 64 * 32 / 2  # two shared experts as one MLP 32 wide, no gate
    assert layer.router == 64 * 8
    gated = layer_params(QWEN2, tensor_parallel_degree=2, moe=True)
    assert gated.shared == 3 * 64 * 32 / 2 + 64  # the h x 1 gate is replicated


@pytest.mark.parametrize("model", [DEEPSEEK, QWEN2], ids=lambda m: m.name)
@pytest.mark.parametrize("p", [1, 2, 4])
def test_stage_parameters_sum_to_the_total_and_hold_the_right_moe_layers(model: ModelSpec, p: int) -> None:
    layout = _layout(p=p)
    held = [stage_params(model, layout, s) for s in range(p)]
    assert sum(h.total for h in held) == pytest.approx(total_params(model), rel=1e-12)
    assert sum(stage_moe_layers(model, layout)) == model.num_moe_layers == 3
    if p == 4:  # one layer a stage: which are MoE is the model's rule
        moe = [model.is_moe_layer(i) for i in range(4)]
        assert [h.expert > 0 for h in held] == moe
        assert stage_moe_layers(model, layout) == tuple(int(m) for m in moe)


def _matmul_weights(model: ModelSpec) -> int:
    """Active parameters that are GEMM weights: less embeddings, norms (and the MLA latent norms,
    the Qwen3 q/k norms) and biases."""
    norms = (2 * model.num_hidden_layers + 1) * norm_params(model)
    latent_norms = ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * model.num_hidden_layers
    qk_norms = 2 * model.head_size * model.num_hidden_layers if model.qk_norm else 0
    q_kv_biases = (
        (model.num_attention_heads + 2 * model.kv_heads) * model.head_size * model.num_hidden_layers
        if model.qkv_bias
        else 0
    )
    return active_params(model) - embedding_params(model) - norms - latent_norms - qk_norms - q_kv_biases


@pytest.mark.parametrize("model", [DEEPSEEK, QWEN2], ids=lambda m: m.name)
def test_model_flops_are_six_times_active_weights_per_token_plus_attention_core(model: ModelSpec) -> None:
    s = TRAINING.seq_len
    core = 2 * s * s * model.num_attention_heads * (model.qk_head_size + model.v_head_size)
    expected = 6 * s * _matmul_weights(model) + 3 * model.num_hidden_layers * core
    assert model_flops_per_sequence(model, s) == expected


def test_mla_gemms_split_the_up_projections_by_heads_and_keep_the_down_projections_whole() -> None:
    work = layer_work(DEEPSEEK, TRAINING, _layout(t=2), moe=False)
    tokens = 2 * 32
    assert work.dense_gemms[:5] == (
        Gemm(tokens, 24, 64),  # q_a, whole
        Gemm(tokens, 4 * 24 // 2, 24),  # q_b, two heads a rank
        Gemm(tokens, 32 + 8, 64),  # kv_a with the rope key, whole
        Gemm(tokens, 4 * (16 + 12) // 2, 32),  # kv_b
        Gemm(tokens, 64, 4 * 12 // 2),  # o, row-parallel
    )
    assert work.attention_gemms == (Gemm(32, 32, 24, batch=2 * 2), Gemm(32, 12, 32, batch=2 * 2))


def test_moe_layer_gemms_add_shared_experts_for_every_token_and_the_gate() -> None:
    work = layer_work(QWEN2, TRAINING, _layout(ep=1), moe=True)
    tokens = 2 * 32
    assert work.dense_gemms[2:] == (
        Gemm(tokens, 4, 64, linear=False),  # router: every FP8 recipe keeps it in bf16
        Gemm(tokens * 2 // 4, 2 * 16, 64, batch=4, grouped=True),  # routed experts at their width
        Gemm(tokens * 2 // 4, 64, 16, batch=4, grouped=True),
        Gemm(tokens, 2 * 32, 64),  # shared expert, every token
        Gemm(tokens, 64, 32),
        Gemm(tokens, 1, 64, linear=False),  # its sigmoid gate
    )
    dense = layer_work(QWEN2, TRAINING, _layout(), moe=False)
    assert dense.dense_gemms[2:] == (Gemm(tokens, 2 * 96, 64), Gemm(tokens, 64, 96))
    shapes = set(profile_gemm_shapes(QWEN2, 32, 1))
    assert {(tokens, 2 * 96, 64), (tokens, 2 * 32, 64)} <= shapes  # both kinds are profiled


def test_mla_and_shared_expert_activations_by_hand() -> None:
    act, tokens = 2, 2 * 32
    dense = layer_activations(DEEPSEEK, seq_len=32, micro_batch_size=2, activation_dtype=DType.BF16, moe=False)
    attention = act * tokens * (64 + 2 * (24 + 32) + 8 + 2 * 4 * 24 + 2 * 4 * 12)
    assert dense.attention_bytes == attention
    assert dense.mlp_bytes == act * tokens * (64 + 3 * 96)
    moe = layer_activations(QWEN2, seq_len=32, micro_batch_size=2, activation_dtype=DType.BF16, moe=True)
    router = act * tokens * 64 + 4 * tokens * 4
    routed = 2 * (2 * act * tokens * 64 + 3 * act * tokens * 16)
    shared = 3 * act * tokens * 32 + act * tokens * 64 + act * tokens
    assert moe.mlp_bytes == router + routed + shared


def test_stage_time_prices_expert_communication_on_moe_layers_only() -> None:
    cluster = cluster_preset("dgx-h100", 1)
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        expert_parallel_degree=4,
        micro_batch_size=1,
    )
    times = stage_times(
        DEEPSEEK,
        TRAINING,
        cluster,
        layout,
        tensor_groups=grp.tensor_groups(layout),
        expert_groups=grp.expert_groups(layout),
    )
    # Stage 0 holds the dense layer 0 and MoE layer 1; stage 1 two MoE layers.
    assert times[0].expert_parallel_comm_s > 0
    assert times[1].expert_parallel_comm_s == pytest.approx(2 * times[0].expert_parallel_comm_s, rel=1e-12)
    assert times[0].compute_s != times[1].compute_s
