"""One transformer layer as one tensor-parallel rank of tp > 1 computes it, for timing its forward
and backward at the shapes plans use: the rank's slice of the heads and of the MLP, no
communication (the collectives are measured on their own). Follows the model's MLP (GELU or
SwiGLU), grouped query attention and norm kind, not every detail of the runtime's layer (it fuses
q, k and v, and has no rotary embedding): at tp 1 the profiler times the runtime's own layer
(``profiler.ops._local_layer``), and this one only stands in for an MoE layer the runtime does
not build. A multi-head latent attention model's rank is the runtime's own layer at every tp, of
the rank's share of the model (``rank_share``)."""

import torch
import torch.nn.functional as F
from torch import nn

from planner.schemas import Activation, ModelSpec, NormKind


def rank_share(model: ModelSpec, tensor_parallel_degree: int) -> ModelSpec:
    """``model`` cut to what one tensor-parallel rank of a multi-head latent attention layer
    computes: 1/t of its heads (the up-projections' rows, the output projection's columns) and of
    the dense MLP's width, its down-projections and their norms whole, as the runtime splits it
    (``runtime.tensor_parallel.split_latent_attention``). ``model`` itself at tp 1."""
    t = tensor_parallel_degree
    if t == 1:
        return model
    heads = model.num_attention_heads // t
    update = {"num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": model.ffn_size // t}
    return model.model_copy(update=update)


class LocalLayer(nn.Module):
    """The local compute of one tensor-parallel rank of a decoder layer."""

    def __init__(self, model: ModelSpec, tensor_parallel_degree: int) -> None:
        super().__init__()
        t, h, hd = tensor_parallel_degree, model.hidden_size, model.head_size
        self.heads, self.kv_heads, self.head_dim = model.num_attention_heads // t, model.kv_heads // t, hd
        self.norm1 = nn.LayerNorm(h) if model.norm_type is NormKind.LAYERNORM else nn.RMSNorm(h)
        self.norm2 = nn.LayerNorm(h) if model.norm_type is NormKind.LAYERNORM else nn.RMSNorm(h)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.kv_heads) * hd, bias=model.attention_bias)
        self.out = nn.Linear(self.heads * hd, h, bias=model.attention_bias)
        self.gated = model.hidden_act.gated
        self.gelu_gate = model.hidden_act is Activation.GEGLU
        f = model.ffn_size // t
        self.up = nn.Linear(h, (2 if self.gated else 1) * f, bias=model.mlp_bias)
        self.down = nn.Linear(f, h, bias=model.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, -1))
        up = self.up(self.norm2(x))
        if self.gated:
            gate, value = up.chunk(2, dim=-1)
            hidden = (F.gelu(gate, approximate="tanh") if self.gelu_gate else F.silu(gate)) * value
        else:
            hidden = F.gelu(up)
        out: torch.Tensor = x + self.down(hidden)
        return out
