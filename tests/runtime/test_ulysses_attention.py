"""All-to-all attention over a contiguous split (runtime.ulysses_attention, the
DeepSpeed-Ulysses kind of context parallelism) equals causal attention on one process: outputs
and q/k/v gradients, cp 2 and 4 gloo ranks, with grouped-query attention whose kv heads cp divides
and whose kv heads it does not (repeated up to a multiple of cp); the bytes it counts are
(cp - 1)/cp of the four buffers (q, k, v, output) forward and again backward, as the cost model
prices them."""

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from attention_reference import DTYPES, assert_close_to_whole, whole_sequence_attention, worst_over_ranks
from harness import run_ranks

from planner.schemas.errors import InfeasibleConfigError
from runtime.context_parallel import SentBytes, contiguous_positions
from runtime.ulysses_attention import ulysses_attention

CASES = [  # (batch, heads, kv heads, tokens a rank, head dim, dtype, causal)
    (2, 4, 4, 3, 8, "float64", True),
    (1, 8, 2, 4, 4, "float64", True),  # cp 4: 2 kv heads, each repeated twice
    (1, 4, 1, 2, 8, "float64", True),  # one kv head: repeated cp times
    (2, 4, 2, 2, 8, "float32", False),
    (1, 4, 2, 4, 8, "bfloat16", True),
]


def test_contiguous_positions_by_hand() -> None:
    assert contiguous_positions(8, 2, 1).tolist() == [4, 5, 6, 7]
    assert contiguous_positions(12, 4, 0).tolist() == [0, 1, 2]
    with pytest.raises(InfeasibleConfigError, match="into 4 equal chunks, but seq_len=10 is not divisible by 4"):
        contiguous_positions(10, 4, 0)


def _compare(cases: list[tuple[Any, ...]]) -> list[dict[str, float]]:
    """Runs on every rank: each case's largest differences from whole-sequence SDPA over all
    ranks, and whether every rank's counted bytes are the hand count."""
    group = dist.group.WORLD
    assert group is not None
    cp, rank = dist.get_world_size(), dist.get_rank()
    results = []
    for i, (b, h, hk, held, d, dtype_name, causal) in enumerate(cases):
        (q, k, v, dout), ref, full = whole_sequence_attention(i, (b, h, hk, cp * held, d), DTYPES[dtype_name], causal)
        mine = slice(rank * held, (rank + 1) * held)
        local = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
        sent = SentBytes()
        out = ulysses_attention(*local, group, causal=causal, sent=sent)
        out.backward(dout[:, :, mine])
        errors = []
        for part, theirs in zip([out, *(t.grad for t in local)], [ref, *(t.grad for t in full)], strict=True):
            shards = [torch.empty_like(part) for _ in range(cp)]
            dist.all_gather(shards, part.detach().contiguous(), group=group)
            errors.append((torch.cat(shards, dim=2).to(theirs.dtype) - theirs).abs().max())
        # q and the output h heads, k and v lcm(hk, cp) heads, of b x held tokens; (cp - 1)/cp of each sent.
        buffers = b * held * d * (2 * h + 2 * math.lcm(hk, cp))
        expected = buffers * (cp - 1) // cp * q.element_size()
        results.append(worst_over_ranks(errors, (sent.forward_bytes, sent.backward_bytes) != (expected, expected)))
    return results


@pytest.mark.distributed
@pytest.mark.parametrize("cp", [2, 4])
def test_all_to_all_attention_equals_full_attention(cp: int, tmp_path: Path) -> None:
    cases = [c for c in CASES if c[1] % cp == 0]
    assert_close_to_whole(cases, run_ranks(cp, _compare, cases, workdir=tmp_path))


def _refuse(workdir: str) -> str:
    group = dist.group.WORLD
    assert group is not None
    try:  # 3 query heads over 2 ranks
        ulysses_attention(torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4), group)
    except InfeasibleConfigError as e:
        return str(e)
    return "accepted"


@pytest.mark.distributed
def test_all_to_all_attention_refuses_heads_cp_does_not_divide(tmp_path: Path) -> None:
    message = run_ranks(2, _refuse, str(tmp_path), workdir=tmp_path)
    assert "a tensor-parallel rank's 3 query heads, but cp does not divide 3" in message
