"""Context parallelism: causal self-attention over a sequence split across the ranks of a cp group,
by ring attention (Liu et al. 2023, arXiv 2310.01889; ``runtime.ring_attention``) on a
load-balanced ("zig-zag") split, or by all-to-alls between a sequence split and a head split
(DeepSpeed-Ulysses; ``runtime.ulysses_attention``) on a contiguous one. ``runtime.context_share``
holds a rank's place in its group and runs the kind its layout names. This module holds what they
share: the splits and the counter of the bytes a rank sends.

Split. The sequence of length s is cut into 2 cp chunks of c = s / (2 cp) tokens; rank r holds
chunks r and 2 cp - 1 - r, in that order (as Megatron-Core and torchtitan split it). Under a causal
mask every rank then has the same attention work: its own two chunks against themselves (a causal
block), and against every other rank's chunks exactly half a block
(``runtime.ring_attention.visible_block``).

Contiguous split (``ContextParallelKind.ALL_TO_ALL``). Rank r holds tokens [r s/cp, (r+1) s/cp);
every rank attends over the whole sequence for 1/cp of the heads, so no split balances anything.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from planner.schemas.context_split import check_context_split
from planner.schemas.enums import ContextParallelKind
from planner.schemas.geometry import context_chunks


@dataclass(slots=True)
class SentBytes:
    """A counter of the bytes this rank hands to its sends, by pass; give one to ``ring_attention`` or
    ``ulysses_attention`` to measure its traffic (it counts every call it is given to, forward and backward)."""

    forward_bytes: int = 0
    backward_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


def zigzag_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The global positions (int64, ``seq_len / cp`` of them, ascending) of the tokens ``rank``
    holds, for rotary and absolute position embeddings. seq 8, cp 2: rank 0 holds 0, 1, 6, 7."""
    check_context_split(ContextParallelKind.RING, cp, seq_len)
    c = seq_len // (2 * cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in context_chunks(cp, rank)])


def split_sequence(x: torch.Tensor, cp: int, rank: int, dim: int) -> torch.Tensor:
    """``rank``'s share of ``x`` along its sequence dim ``dim``: chunks r and 2 cp - 1 - r."""
    s = x.shape[dim]
    check_context_split(ContextParallelKind.RING, cp, s)
    c = s // (2 * cp)
    return torch.cat([x.narrow(dim, i * c, c) for i in context_chunks(cp, rank)], dim=dim)


def merge_sequence(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """The inverse of ``split_sequence``: the whole tensor from every rank's share, in rank order."""
    cp = len(shards)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for rank, shard in enumerate(shards):
        first, second = shard.chunk(2, dim=dim)
        a, b = context_chunks(cp, rank)
        chunks[a], chunks[b] = first, second
    return torch.cat([c for c in chunks if c is not None], dim=dim)


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """The whole tensor on every rank of ``group`` from each rank's share (an all-gather)."""
    shards = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, x.contiguous(), group=group)
    return merge_sequence(shards, dim)


def contiguous_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The global positions (int64, ascending) of the tokens ``rank`` holds under the all-to-all
    kind's contiguous split: [r s / cp, (r + 1) s / cp). seq 8, cp 2: rank 1 holds 4, 5, 6, 7."""
    check_context_split(ContextParallelKind.ALL_TO_ALL, cp, seq_len)
    held = seq_len // cp
    return torch.arange(rank * held, (rank + 1) * held)
