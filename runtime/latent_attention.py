"""Multi-head latent attention (DeepSeek-V2/V3), as transformers' ``DeepseekV3Attention``
computes it and the cost model prices it (``cost_models.params.attention_params``,
``cost_models.layer_work``):

- queries: q = q_b(RMSNorm(q_a(x))), or q = q(x) without a query rank (``q_lora_rank`` None),
  each head's qk_nope_head_dim + qk_rope_head_dim channels split into a non-rotary and a rotary part;
- keys and values: kv_a(x) = [compressed kv (kv_lora_rank), k_rope (qk_rope_head_dim, one rotary
  key every head shares)], kv_b(RMSNorm(compressed)) = per head [k_nope, v (v_head_dim)];
- rotary positions on q's and k's rotary parts; scores over nope + rope channels, scale
  1/sqrt(nope + rope); the output projection o over heads x v_head_dim.

Under tensor parallelism (``runtime.tensor_parallel``) the per-head projections (q_b or q,
kv_b) hold a rank's heads (DTensors split by rows) and o its columns (row-parallel), while the
down-projections q_a and kv_a and their norms stay whole on every rank, as Megatron-Core's
MultiLatentAttention keeps them. The whole module is then one tensor-parallel region: it takes
the whole input as a plain tensor whose gradient is partial on each rank (its heads' share,
summed once at the entry), and the gradients of the whole-held weights are each rank's heads'
share too, summed over the group by ``PartialGradients``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from planner.schemas import ModelSpec
from runtime.attention_parts import attention_core, positions_of, rotary
from runtime.context_share import ContextShare
from runtime.kernels import RMSNorm

LATENT_NORM_EPS = 1e-6
"""transformers' DeepseekV3 default rms_norm_eps, which its q_a and kv_a norms use."""


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """A rank's own part of a (possibly tensor-parallel) weight: its heads' rows."""
    return t.to_local() if isinstance(t, DTensor) else t


def _project(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear`` applied with this rank's rows of its weight (all of them when it is not split):
    a plain tensor of this rank's heads, whose input gradient stays partial (the region's entry
    sums it)."""
    weight = _local(linear.weight)
    assert weight is not None
    return F.linear(x, weight, _local(linear.bias))


class LatentAttention(nn.Module):
    """Causal multi-head latent attention (see the module's docstring); the head count follows
    the (possibly tensor-parallel) up-projections' rows. ``recompute_core`` drops the attention
    core's activations and recomputes them in the backward (selective recompute)."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        assert model.is_mla and model.kv_lora_rank is not None
        self.recompute_core = False
        h, a = model.hidden_size, model.num_attention_heads
        self.nope, self.rope = model.qk_nope_head_dim or 0, model.qk_rope_head_dim or 0
        self.qk_dim, self.v_dim, self.kv_rank = self.nope + self.rope, model.v_head_size, model.kv_lora_rank
        self.rope_theta = model.rope_theta
        bias, rq = model.attention_bias, model.q_lora_rank
        self.q: nn.Linear | None = nn.Linear(h, a * self.qk_dim, bias=False) if rq is None else None
        self.q_a: nn.Linear | None = nn.Linear(h, rq, bias=bias) if rq is not None else None
        self.q_a_norm: RMSNorm | None = RMSNorm(rq, eps=LATENT_NORM_EPS) if rq is not None else None
        self.q_b: nn.Linear | None = nn.Linear(rq, a * self.qk_dim, bias=False) if rq is not None else None
        self.kv_a = nn.Linear(h, self.kv_rank + self.rope, bias=bias)
        self.kv_a_norm = RMSNorm(self.kv_rank, eps=LATENT_NORM_EPS)
        self.kv_b = nn.Linear(self.kv_rank, a * (self.nope + self.v_dim), bias=False)
        self.o = nn.Linear(a * self.v_dim, h, bias=bias)
        self.context: ContextShare | None = None
        """Set under context parallelism, as ``runtime.model.Attention.context``."""

    def replicated(self) -> list[nn.Module]:
        """The modules every tensor-parallel rank holds whole: the down-projections and their norms."""
        return [m for m in (self.q_a, self.q_a_norm, self.kv_a, self.kv_a_norm) if m is not None]

    def per_head(self) -> dict[str, nn.Linear]:
        """The up-projections split by heads over the tensor-parallel group, by name (q_b, or q)."""
        up = {"q": self.q, "q_b": self.q_b, "kv_b": self.kv_b}
        return {name: linear for name, linear in up.items() if linear is not None}

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.q is not None:
            return _project(self.q, x)
        assert self.q_a is not None and self.q_a_norm is not None and self.q_b is not None
        return _project(self.q_b, self.q_a_norm(self.q_a(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self._queries(x).view(b, s, -1, self.qk_dim).transpose(1, 2)
        heads = q.shape[1]
        compressed, k_rope = torch.split(self.kv_a(x), [self.kv_rank, self.rope], dim=-1)
        kv = _project(self.kv_b, self.kv_a_norm(compressed)).view(b, s, heads, self.nope + self.v_dim)
        k_nope, v = torch.split(kv.transpose(1, 2), [self.nope, self.v_dim], dim=-1)
        q_nope, q_rope = torch.split(q, [self.nope, self.rope], dim=-1)
        positions = positions_of(s, x.device, self.context)
        q_rope = rotary(q_rope, positions, self.rope_theta)
        k_rope = rotary(k_rope.view(b, 1, s, self.rope), positions, self.rope_theta)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(b, heads, s, self.rope)), dim=-1)
        # FlashAttention (CUDA's and the CPU kernel the dry run traces) takes values as wide as the
        # queries and keys: zero-pad them, as transformers' DeepseekV3 does for it, and drop the pad
        pad = self.qk_dim - self.v_dim
        v = F.pad(v, (0, pad)) if pad > 0 else v.contiguous()
        out = attention_core(q, k, v, context=self.context, recompute=self.recompute_core)[..., : self.v_dim]
        result: torch.Tensor = self.o(out.transpose(1, 2).reshape(b, s, heads * self.v_dim))
        return result
