"""Multi-head latent attention (``runtime.latent_attention``) computes what transformers'
``DeepseekV3Attention`` computes from the same weights, with and without a query rank, and holds
the parameters the cost model counts: the whole model, and one tensor-parallel rank's share as
the profiler times it (``profiler.layer.rank_share``). Its training under tensor, expert and
pipeline parallelism is checked against the reference in ``test_moe_shapes_parity``."""

import pytest
import torch

from cost_models.params import layer_params, total_params
from planner.schemas import ModelSpec
from profiler.layer import rank_share
from runtime.latent_attention import LatentAttention
from runtime.model import Block, Decoder, loss_fn

BASE = dict(
    name="tiny-mla",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=96,
    vocab_size=128,
    hidden_act="silu",
    max_position_embeddings=64,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
)
MODELS = {
    "query-rank": ModelSpec(q_lora_rank=24, **BASE),
    "no-query-rank": ModelSpec(q_lora_rank=None, **BASE),
    "biases": ModelSpec(q_lora_rank=24, attention_bias=True, **BASE),
}
HF_NAMES = {
    "q": "q_proj",
    "q_a": "q_a_proj",
    "q_a_norm": "q_a_layernorm",
    "q_b": "q_b_proj",
    "kv_a": "kv_a_proj_with_mqa",
    "kv_a_norm": "kv_a_layernorm",
    "kv_b": "kv_b_proj",
    "o": "o_proj",
}
"""Our projections' names and transformers' DeepseekV3Attention's."""


@pytest.mark.parametrize("name", list(MODELS))
def test_latent_attention_computes_what_transformers_deepseek_v3_computes(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    model = MODELS[name]
    config = transformers.DeepseekV3Config(
        **{k: v for k, v in BASE.items() if k not in ("name", "hidden_act")},
        q_lora_rank=model.q_lora_rank,
        attention_bias=model.attention_bias,
        rope_scaling=None,
        rms_norm_eps=1e-6,
        moe_intermediate_size=32,
    )
    config._attn_implementation = "sdpa"
    theirs, ours = hf.DeepseekV3Attention(config, 0).eval(), LatentAttention(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mine, their in HF_NAMES.items():
            module = getattr(ours, mine)
            for p_name, p in [] if module is None else module.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if p.dim() > 1 else 0.5) + (p.dim() == 1))
                getattr(getattr(theirs, their), p_name).copy_(p)
    x = torch.randn(2, 10, model.hidden_size, generator=gen)
    positions = torch.arange(10).expand(2, 10)
    expected, _ = theirs(x, position_embeddings=hf.DeepseekV3RotaryEmbedding(config)(x, positions), attention_mask=None)
    torch.testing.assert_close(ours(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_decoder_holds_the_parameters_the_cost_model_counts(name: str) -> None:
    model = MODELS[name]
    net = Decoder(model, seed=0)
    assert sum(p.numel() for p in net.parameters()) == total_params(model)
    attn = net.layers["0"].attn
    assert isinstance(attn, LatentAttention) and (attn.q is None) == (model.q_lora_rank is not None)
    tokens = torch.randint(0, model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.autograd.backward(loss_fn(net(tokens), tokens))
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize("name", ["query-rank", "no-query-rank"])  # the cost model splits o's bias, a rank holds it
def test_a_tensor_parallel_ranks_share_holds_what_the_cost_model_counts_for_it(name: str) -> None:
    model = MODELS[name]
    block = Block(rank_share(model, 2))
    planned = layer_params(model, tensor_parallel_degree=2)
    assert isinstance(block.attn, LatentAttention)
    assert sum(p.numel() for p in block.attn.parameters()) == planned.attention
    assert sum(p.numel() for p in block.mlp.parameters()) == planned.mlp
