"""Whether context parallelism can split a sequence and its attention over cp ranks: the one rule
that the cost models, ``planner launch``'s and ``planner run``'s refusals and the runtime's
attention all apply, with its one message."""

from planner.schemas.enums import ContextParallelKind
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import splits_into_context_chunks


def check_context_split(
    kind: ContextParallelKind, context_parallel_degree: int, seq_len: int, query_heads: int | None = None
) -> None:
    """Raise InfeasibleConfigError unless ``context_parallel_degree`` ranks of ``kind`` can split
    a sequence of ``seq_len`` tokens and its attention.

    Ring: 2 cp equal chunks (the zig-zag split of ``geometry.context_chunks``, which balances
    causal attention). All-to-all (DeepSpeed-Ulysses): cp equal contiguous chunks, and a
    tensor-parallel rank's ``query_heads`` divisible by cp, each rank attending with 1/cp of them
    (its key/value heads are repeated up to a multiple of cp where they are fewer, so they need no
    rule). The rule holds for cp = 1 too (a ring of one still cuts 2 chunks); a layout without
    context parallelism need not ask.

    Args:
        kind: how attention spans the ranks.
        context_parallel_degree: cp, the ranks that split every sequence.
        seq_len: tokens of a whole sequence.
        query_heads: a tensor-parallel rank's query heads, which the all-to-all shares out; None
            where only the sequence is split (the runtime's positions of a rank's tokens).
    """
    cp, s = context_parallel_degree, seq_len
    if kind is ContextParallelKind.RING:
        if not splits_into_context_chunks(s, cp):
            raise InfeasibleConfigError(
                f"context parallelism over cp={cp} ranks splits every sequence into 2 x cp = {2 * cp} equal chunks, "
                f"but seq_len={s} is not divisible by {2 * cp}; use a cp for which 2 cp divides it"
            )
        return
    if query_heads is not None and query_heads % cp:
        choices = [c for c in range(2, query_heads + 1) if query_heads % c == 0]
        raise InfeasibleConfigError(
            f"all-to-all context parallelism over cp={cp} ranks gives each rank 1/cp of a tensor-parallel rank's "
            f"{query_heads} query heads, but cp does not divide {query_heads}; use a cp among "
            f"{', '.join(map(str, choices)) or 'none (one head)'} or the ring (context_parallel_kind 'ring')"
        )
    if s % cp:
        raise InfeasibleConfigError(
            f"all-to-all context parallelism over cp={cp} ranks splits every sequence into {cp} equal chunks, "
            f"but seq_len={s} is not divisible by {cp}; use a cp that divides it"
        )
