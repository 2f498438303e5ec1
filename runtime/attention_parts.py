"""What both attention modules of the decoder (``runtime.model.Attention`` and
``runtime.latent_attention.LatentAttention``) compute alike: rotary positions and the causal
attention core, over the whole sequence or, under context parallelism, this rank's share."""

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from runtime.context_share import ContextShare


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` (b, heads, s, d) by position-dependent angles (RoFormer)."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    angles = positions.float()[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def positions_of(held: int, device: torch.device, context: ContextShare | None) -> torch.Tensor:
    """The sequence positions of the ``held`` tokens a rank holds: 0..held - 1, or under context
    parallelism its share's positions in the whole sequence."""
    if context is None:
        return torch.arange(held, device=device)
    return context.positions(held).to(device)


def attention_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, context: ContextShare | None, recompute: bool
) -> torch.Tensor:
    """Causal attention of q (b, heads, s, dqk) over k (b, kv_heads, s, dqk) and v (b, kv_heads,
    s, dv), scale 1/sqrt(dqk): SDPA, or the context-parallel group's (``ContextShare.attention``);
    ``recompute`` drops the core's activations and recomputes them in the backward (selective
    recompute's core_attn, Korthikanti et al. 2022)."""
    core: Callable[..., torch.Tensor]
    if context is not None:
        core = context.attention
    else:
        core = partial(F.scaled_dot_product_attention, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    if recompute:
        out: torch.Tensor = checkpoint(core, q, k, v, use_reentrant=False)
        return out
    return core(q, k, v)
