"""Context parallelism: each rank of a context-parallel group holds a share of every sequence
(the zig-zag split of ``schemas.geometry.context_chunks``), and attention brings the other
ranks' keys and values to its queries.

(Integration scaffold: the attention gathers every key/value block; the ring replaces it.)
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.schemas.geometry import context_chunks


def zigzag_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The positions in a sequence of ``seq_len`` tokens that context rank ``rank`` of ``cp`` holds."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} must divide into 2 x cp = {2 * cp} equal chunks")
    size = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in context_chunks(cp, rank)])


def split_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Context rank ``rank``'s share of ``x`` along its sequence dimension ``dim``."""
    parts = x.chunk(2 * cp, dim=dim)
    first, last = context_chunks(cp, rank)
    return torch.cat((parts[first], parts[last]), dim=dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


@dataclass(frozen=True)
class ContextShare:
    """This rank's place in its context-parallel group."""

    degree: int
    rank: int
    group: dist.ProcessGroup

    def positions(self, held: int) -> torch.Tensor:
        """Positions in the whole sequence of the ``held`` tokens this rank holds."""
        return zigzag_positions(held * self.degree, self.degree, self.rank)

    def split(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's share of whole sequences ``x``."""
        return split_sequence(x, self.degree, self.rank, dim)

    def hold(self, chunk: Any) -> None:
        """Make model chunk ``chunk`` (a ``runtime.model.Decoder``) take this rank's share of each
        sequence: its positions and every attention layer's keys and values come from the group."""
        chunk.context = self
        for block in chunk.layers.values():
            block.attn.context = self

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequences' keys and values."""
        held = q.shape[2]
        gathered = (_Gather.apply(t, self.group) for t in (k, v))  # type: ignore[no-untyped-call]
        keys, values = gathered  # (cp, b, heads, held, d) each
        order = torch.cat([zigzag_positions(held * self.degree, self.degree, r) for r in range(self.degree)])
        keys = keys.permute(1, 2, 0, 3, 4).flatten(2, 3)
        values = values.permute(1, 2, 0, 3, 4).flatten(2, 3)
        mask = self.positions(held)[:, None] >= order[None, :]
        out: torch.Tensor = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask.to(q.device), enable_gqa=q.shape[1] != k.shape[1]
        )
        return out
