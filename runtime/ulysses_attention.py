"""All-to-all attention (DeepSpeed-Ulysses, Jacobs et al. 2023; ``ContextParallelKind.ALL_TO_ALL``)
over the contiguous split of a sequence across the ranks of a cp group (``runtime.context_parallel``):
rank r holds tokens [r s/cp, (r+1) s/cp); q, k and v go from its tokens of all heads to all tokens
of 1/cp of the heads, attention runs there, and the output comes back. Its all-to-alls
(``all_to_all_single``, which gloo runs) count the bytes each rank sends to the others, (cp - 1)/cp
of each buffer, as ``cost_models.context_parallel`` prices them.
"""

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.schemas.context_split import check_context_split
from planner.schemas.enums import ContextParallelKind
from runtime.context_parallel import SentBytes


def _exchange(send: torch.Tensor, group: dist.ProcessGroup, sent: SentBytes | None, *, backward: bool) -> torch.Tensor:
    """An all-to-all of ``send`` (cp, ...): part j goes to rank j, part j of the result came from
    rank j. Counts the parts this rank sends to others."""
    send = send.contiguous()
    recv = torch.empty_like(send)  # contiguous as send is (empty_like keeps a tensor's strides)
    dist.all_to_all_single(recv, send, group=group)
    if sent is not None:
        others = send.numel() // send.shape[0] * (send.shape[0] - 1) * send.element_size()
        if backward:
            sent.backward_bytes += others
        else:
            sent.forward_bytes += others
    return recv


def _to_heads(x: torch.Tensor, group: dist.ProcessGroup, sent: SentBytes | None, backward: bool) -> torch.Tensor:
    """(b, H, s / cp, d) of this rank's tokens to (b, H / cp, s, d) of its heads: head block j
    goes to rank j; the blocks received, from ranks 0 .. cp - 1, are the sequence in order."""
    cp = dist.get_world_size(group)
    b, heads, n, d = x.shape
    recv = _exchange(x.reshape(b, cp, heads // cp, n, d).transpose(0, 1), group, sent, backward=backward)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, heads // cp, cp * n, d)


def _to_sequence(y: torch.Tensor, group: dist.ProcessGroup, sent: SentBytes | None, backward: bool) -> torch.Tensor:
    """The inverse of ``_to_heads``: (b, H / cp, s, d) to (b, H, s / cp, d)."""
    cp = dist.get_world_size(group)
    b, heads, s, d = y.shape
    recv = _exchange(y.reshape(b, heads, cp, s // cp, d).permute(2, 0, 1, 3, 4), group, sent, backward=backward)
    return recv.transpose(0, 1).reshape(b, cp * heads, s // cp, d)


class _AllToAll(torch.autograd.Function):
    """An all-to-all between the sequence split and the head split: to the heads (``to_heads``)
    or back to the sequence; its backward is the same exchange the other way."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, sent: SentBytes | None, to_heads: bool
    ) -> torch.Tensor:
        ctx.group, ctx.sent, ctx.to_heads = group, sent, to_heads
        return (_to_heads if to_heads else _to_sequence)(x, group, sent, False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        back = _to_sequence if ctx.to_heads else _to_heads
        return back(grad, ctx.group, ctx.sent, True), None, None, None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    causal: bool = True,
    sent: SentBytes | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over a sequence split contiguously across ``group``
    (``contiguous_positions``), by all-to-alls (DeepSpeed-Ulysses, Jacobs et al. 2023): q, k and v
    go from this rank's tokens of all heads to all tokens of 1/cp of the heads, SDPA runs on
    them, and the output comes back; each all-to-all's backward is the reverse one. Where cp does
    not divide the kv heads, each is first repeated so that there are lcm(kv_heads, cp), every
    rank receiving the copies its query heads read (the repeat's backward sums their gradients).
    Equal to ``F.scaled_dot_product_attention(..., is_causal=causal, enable_gqa=True)`` on the whole
    sequence, split the same way.

    Args:
        q: (b, heads, s / cp, d), this rank's queries; cp must divide heads.
        k, v: (b, kv_heads, s / cp, d); heads must be a multiple of kv_heads.
        group: the context-parallel ranks, in the order of the split.
        causal: mask each query's later keys.
        sent: a counter to add the bytes this rank sends to other ranks to (forward and backward).

    Returns:
        (b, heads, s / cp, d), this rank's share of the attention output, in q's dtype.
    """
    cp, heads, kv_heads = dist.get_world_size(group), q.shape[1], k.shape[1]
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or heads % kv_heads:
        raise ValueError(
            f"all-to-all attention takes (b, heads, s, d) q, k, v with heads a multiple of kv heads; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_context_split(ContextParallelKind.ALL_TO_ALL, cp, q.shape[2] * cp, heads)
    handed = math.lcm(kv_heads, cp)
    if handed != kv_heads:
        k, v = (t.repeat_interleave(handed // kv_heads, dim=1) for t in (k, v))
    qh, kh, vh = (_AllToAll.apply(t, group, sent, True) for t in (q, k, v))  # type: ignore[no-untyped-call]
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=qh.shape[1] != kh.shape[1])
    result: torch.Tensor = _AllToAll.apply(out, group, sent, False)  # type: ignore[no-untyped-call]
    return result
