"""Ring attention (Liu et al. 2023, arXiv 2310.01889) over the zig-zag split of a sequence across
the ranks of a cp group (``runtime.context_parallel``).

torch's own ``torch.distributed.tensor.experimental.context_parallel`` replaces only the CUDA SDPA
kernels (flash, efficient, cuDNN); on CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``,
for which it has no sharding rule (torch 2.13), so this module does the work itself: that kernel
on blocks, point-to-point sends between them.

Forward. Each rank's keys and values (one stacked tensor) go round the ring in cp - 1 steps; the
transfer of the next step's block is posted before the current block is computed, so the two
overlap. Each block's output and per-row log-sum-exp are merged into the running result with the
log-sum-exp rule: lse = log(e^lse_a + e^lse_b), out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse).

Backward (an autograd Function): the keys and values go round the ring again, the blocks'
probabilities are recomputed from the saved final output and lse (``block_attention_backward``:
P = exp(q k^T scale - lse)), and each rank's key/value gradient accumulator travels one step
behind them: the accumulator of rank j's block starts at rank j + 1, collects the contribution of
each rank it passes and reaches j after cp - 1 hops, where j adds its own (diagonal) contribution.

Grouped-query attention: query head i reads key/value head i // (heads / kv_heads), as SDPA's
``enable_gqa`` does; only the kv heads travel. Arithmetic is in float32 (float64 inputs stay
float64); the key/value gradient accumulators travel in that precision, the keys and values in
their own dtype. Each block runs torch's CPU flash-attention kernel (``block_attention``: it returns
the lse and its backward takes it back); on other devices the same math in plain matmuls.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from planner.schemas.context_split import check_context_split
from planner.schemas.enums import ContextParallelKind
from runtime.context_parallel import SentBytes


@dataclass(frozen=True, slots=True)
class Block:
    """Which of a rank's queries attend to which of another rank's keys under the causal mask, in
    halves of the local sequence (half 0: the rank's first chunk, half 1: its second)."""

    query_halves: range
    key_halves: range
    causal: bool
    """The visible part is lower-triangular (the diagonal block); otherwise it is all visible."""


def visible_block(rank: int, source: int, cp: int) -> Block:
    """The part of (rank's queries) x (source's keys) the causal mask leaves visible, from the chunks'
    global order. Rank r holds chunks (r, 2cp-1-r), source j holds (j, 2cp-1-j):

    - j = r: both chunks against both, causal (the local positions ascend);
    - j < r: chunk j precedes both of r's chunks, chunk 2cp-1-j follows both: all queries, first
      half of the keys;
    - j > r: chunk r precedes both of j's, chunk 2cp-1-r follows both: second half of the queries,
      all keys.
    """
    if source == rank:
        return Block(range(2), range(2), causal=True)
    if source < rank:
        return Block(range(2), range(1), causal=False)
    return Block(range(1, 2), range(2), causal=False)


def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads repeated for the query heads that read them (GQA)."""
    return kv.repeat_interleave(heads // kv.shape[1], dim=1) if kv.shape[1] != heads else kv


def _fold(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A gradient over the query heads summed onto the key/value head each group reads."""
    b, h, n, d = grad.shape
    return grad.view(b, kv_heads, h // kv_heads, n, d).sum(2) if h != kv_heads else grad


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        m, n = s.shape[-2:]
        s = s.masked_fill(torch.ones(m, n, dtype=torch.bool, device=s.device).triu(1 + n - m), float("-inf"))
    return s


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, flash: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's attention output (b, h, m, d) and log-sum-exp of its scores (b, h, m), keys and
    values already expanded to q's heads; ``causal`` masks a square block's upper triangle.
    ``flash``: torch's CPU flash-attention kernel (it returns the lse; tiled, so it does not hold
    the m x n scores); otherwise plain matmuls, on any device."""
    scale = q.shape[-1] ** -0.5
    if flash:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse.to(out.dtype)
    s = _scores(q, k, scale, causal)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def block_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool,
    flash: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of dq, dk, dv given the whole row's output and lse (not the block's own):
    P = exp(q k^T scale - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K scale,
    dK = dS^T Q scale. Summed over a row's blocks they are the whole attention's gradients."""
    scale = q.shape[-1] ** -0.5
    if flash:
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
        )
        return dq, dk, dv
    p = torch.exp(_scores(q, k, scale, causal) - lse.unsqueeze(-1))
    ds = p * (grad_out @ v.transpose(-1, -2) - (grad_out * out).sum(-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ grad_out


def _halves(block: Block, local: int) -> tuple[slice, slice]:
    c = local // 2
    q, k = block.query_halves, block.key_halves
    return slice(q.start * c, q.stop * c), slice(k.start * c, k.stop * c)


class _Ring:
    """Passing stacked blocks to the next rank of the group and taking them from the previous one."""

    def __init__(self, group: dist.ProcessGroup, sent: SentBytes | None) -> None:
        self.group, self.sent = group, sent
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        self.rank, self.cp = rank, cp
        self.next = dist.get_global_rank(group, (rank + 1) % cp)
        self.prev = dist.get_global_rank(group, (rank - 1) % cp)

    def shift(self, x: torch.Tensor, *, tag: int, backward: bool) -> tuple[torch.Tensor, list[dist.Work]]:
        """Post sending ``x`` on and receiving the previous rank's; wait on the works to use it."""
        into = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, self.next, self.group, tag),
            dist.P2POp(dist.irecv, into, self.prev, self.group, tag),
        ]
        if self.sent is not None:
            if backward:
                self.sent.backward_bytes += x.numel() * x.element_size()
            else:
                self.sent.forward_bytes += x.numel() * x.element_size()
        return into, dist.batch_isend_irecv(ops)


def _wait(works: list[dist.Work]) -> None:
    for w in works:
        w.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: dist.ProcessGroup,
        causal: bool,
        sent: SentBytes | None,
    ) -> torch.Tensor:
        ring = _Ring(group, sent)
        dtype = torch.promote_types(q.dtype, torch.float32)
        heads, local, flash = q.shape[1], q.shape[2], q.device.type == "cpu"
        qf = q.to(dtype)
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=dtype, device=q.device)
        kv = torch.stack((k, v)).contiguous()
        for step in range(ring.cp):
            works: list[dist.Work] = []
            if step < ring.cp - 1:
                following, works = ring.shift(kv, tag=step, backward=False)
            source = (ring.rank - step) % ring.cp
            block = visible_block(ring.rank, source, ring.cp) if causal else Block(range(2), range(2), False)
            rows, cols = _halves(block, local)
            kb, vb = (_expand(t[:, :, cols].to(dtype), heads) for t in kv)
            block_out, block_lse = block_attention(qf[:, :, rows], kb, vb, causal=block.causal, flash=flash)
            merged = torch.logaddexp(lse[:, :, rows], block_lse)
            out[:, :, rows] = out[:, :, rows] * torch.exp(lse[:, :, rows] - merged).unsqueeze(-1) + block_out * (
                torch.exp(block_lse - merged).unsqueeze(-1)
            )
            lse[:, :, rows] = merged
            if works:
                _wait(works)
                kv = following
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal = ring, causal
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring: _Ring = ctx.ring
        dtype, kv_heads = out.dtype, k.shape[1]
        heads, local, flash = q.shape[1], q.shape[2], q.device.type == "cpu"
        qf, go = q.to(dtype), grad_out.to(dtype)
        dq = torch.zeros_like(qf)
        own_dkv = torch.zeros((2, *k.shape), dtype=dtype, device=k.device)
        kv = torch.stack((k, v)).contiguous()
        carried: torch.Tensor | None = None  # the accumulator of the block in hand, from the previous rank
        carry_works: list[dist.Work] = []
        for step in range(ring.cp):
            kv_works: list[dist.Work] = []
            if step < ring.cp - 1:
                following, kv_works = ring.shift(kv, tag=2 * step, backward=True)
            source = (ring.rank - step) % ring.cp
            block = visible_block(ring.rank, source, ring.cp) if ctx.causal else Block(range(2), range(2), False)
            rows, cols = _halves(block, local)
            kb, vb = (_expand(t[:, :, cols].to(dtype), heads) for t in kv)
            dqb, dkb, dvb = block_attention_backward(
                go[:, :, rows],
                qf[:, :, rows],
                kb,
                vb,
                out[:, :, rows],
                lse[:, :, rows],
                causal=block.causal,
                flash=flash,
            )
            dq[:, :, rows] += dqb
            dk, dv = _fold(dkb, kv_heads), _fold(dvb, kv_heads)
            if step == 0:
                target = own_dkv
            else:
                _wait(carry_works)
                target = carried if carried is not None else torch.zeros_like(own_dkv)
            target[0][:, :, cols] += dk
            target[1][:, :, cols] += dv
            if step > 0:  # pass the accumulator on; after cp - 1 hops it is back with its owner
                carried, carry_works = ring.shift(target, tag=2 * step + 1, backward=True)
            if kv_works:
                _wait(kv_works)
                kv = following
        if carried is not None:
            _wait(carry_works)
            own_dkv += carried
        return dq.to(q.dtype), own_dkv[0].to(k.dtype), own_dkv[1].to(v.dtype), None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    causal: bool = True,
    sent: SentBytes | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention (scale 1/sqrt(d)) over a sequence split across ``group``, each
    rank holding its ``split_sequence`` share; equal to ``F.scaled_dot_product_attention(...,
    is_causal=causal, enable_gqa=True)`` on the whole sequence, split the same way.

    Args:
        q: (b, heads, s / cp, d), this rank's queries.
        k, v: (b, kv_heads, s / cp, d); heads must be a multiple of kv_heads.
        group: the context-parallel ranks, in the order of the split.
        causal: mask each query's later keys (by global position).
        sent: a counter to add the bytes this rank sends to (forward and backward).

    Returns:
        (b, heads, s / cp, d), this rank's share of the attention output, in q's dtype.
    """
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(
            f"ring attention takes (b, heads, s, d) q, k, v; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, heads, local, _ = q.shape
    if k.shape[0] != b or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"keys {tuple(k.shape)} do not match queries {tuple(q.shape)} in batch, length or head dim")
    if heads % k.shape[1] != 0:
        raise ValueError(f"{heads} query heads are not a multiple of {k.shape[1]} key/value heads")
    cp = dist.get_world_size(group)
    check_context_split(ContextParallelKind.RING, cp, local * cp)
    out: torch.Tensor = _RingAttention.apply(q, k, v, group, causal, sent)  # type: ignore[no-untyped-call]
    return out
