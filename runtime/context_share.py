"""A rank's place in its context-parallel group (``runtime.context_parallel``): its share of every
sequence, and causal attention over the whole sequences by the kind its layout names."""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from planner.schemas import ContextParallelKind
from runtime.context_parallel import SentBytes, contiguous_positions, split_sequence, zigzag_positions
from runtime.ring_attention import ring_attention
from runtime.ulysses_attention import ulysses_attention


@dataclass(frozen=True, slots=True)
class ContextShare:
    """This rank's place in its context-parallel group: which share of every sequence it holds
    (the ring's zig-zag split, the all-to-all's contiguous one), and the group its attention
    exchanges with."""

    degree: int
    rank: int
    group: dist.ProcessGroup
    sent: SentBytes | None = None
    """Counts the bytes this rank sends to other ranks (forward and backward), when given."""
    kind: ContextParallelKind = ContextParallelKind.RING
    """Ring attention (``ring_attention``) or the all-to-all kind (``ulysses_attention``)."""

    @property
    def all_to_all(self) -> bool:
        return self.kind is ContextParallelKind.ALL_TO_ALL

    def positions(self, held: int) -> torch.Tensor:
        """Positions in the whole sequence of the ``held`` tokens this rank holds."""
        if self.all_to_all:
            return contiguous_positions(held * self.degree, self.degree, self.rank)
        return zigzag_positions(held * self.degree, self.degree, self.rank)

    def split(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's share of whole sequences ``x`` (sequence along ``dim``)."""
        if self.all_to_all:
            held = len(contiguous_positions(x.shape[dim], self.degree, self.rank))
            return x.narrow(dim, self.rank * held, held)
        return split_sequence(x, self.degree, self.rank, dim)

    def hold(self, chunk: Any) -> None:
        """Make model chunk ``chunk`` (a ``runtime.model.Decoder``) take this rank's share of each
        sequence: its positions, and every attention layer's keys and values from the group."""
        chunk.context = self
        for block in chunk.layers.values():
            block.attn.context = self

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequences (``ring_attention``
        or ``ulysses_attention``)."""
        if self.all_to_all:
            return ulysses_attention(q, k, v, self.group, sent=self.sent)
        return ring_attention(q, k, v, self.group, sent=self.sent)
