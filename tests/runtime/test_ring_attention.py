"""Ring attention over a zig-zag split (runtime.ring_attention) equals causal attention on one
process: outputs and q/k/v gradients, cp 2 and 4 gloo ranks, with and without grouped-query
attention; its measured traffic equals ``ring_traffic_bytes``, the sends its algorithm makes (the
cost model counts the same per plan: tests/runtime/test_run_context_parallel.py); the split
helpers by hand."""

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from attention_reference import DTYPES, assert_close_to_whole, whole_sequence_attention, worst_over_ranks
from harness import run_ranks

from planner.files.models import load_model
from planner.schemas import PositionEmbedding
from planner.schemas.errors import InfeasibleConfigError
from runtime.context_parallel import SentBytes, gather_sequence, merge_sequence, split_sequence, zigzag_positions
from runtime.model import Attention, rotary
from runtime.ring_attention import block_attention, block_attention_backward, ring_attention, visible_block


def test_zigzag_positions_by_hand() -> None:
    assert zigzag_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert zigzag_positions(8, 4, 0).tolist() == [0, 7]
    assert zigzag_positions(8, 4, 3).tolist() == [3, 4]
    assert zigzag_positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    assert zigzag_positions(6, 1, 0).tolist() == [0, 1, 2, 3, 4, 5]


def test_split_and_merge_sequence() -> None:
    x = torch.arange(2 * 8 * 3).view(2, 8, 3)
    shards = [split_sequence(x, 2, r, dim=1) for r in range(2)]
    assert shards[0][0, :, 0].tolist() == [0, 3, 18, 21]  # positions 0, 1, 6, 7
    assert torch.equal(shards[1][1], x[1, 2:6])
    assert torch.equal(merge_sequence(shards, dim=1), x)
    for cp in (1, 2, 4):
        shards = [split_sequence(x, cp, r, dim=1) for r in range(cp)]
        assert torch.equal(merge_sequence(shards, dim=1), x)
        for r, shard in enumerate(shards):
            assert torch.equal(shard, x[:, zigzag_positions(8, cp, r)])


def test_refuses_a_sequence_that_does_not_split() -> None:
    with pytest.raises(InfeasibleConfigError, match=r"seq_len=12 is not divisible by 8"):
        zigzag_positions(12, 4, 0)
    with pytest.raises(InfeasibleConfigError, match="seq_len=6 is not divisible by 4"):
        split_sequence(torch.zeros(1, 6), 2, 0, dim=1)
    with pytest.raises(ValueError, match="context_rank=2"):
        zigzag_positions(8, 2, 2)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_visible_blocks_are_the_causal_mask(cp: int) -> None:
    """Each block's visible halves are exactly where a key's global position <= the query's."""
    seq = 4 * cp
    for rank in range(cp):
        qpos = zigzag_positions(seq, cp, rank)
        for source in range(cp):
            kpos = zigzag_positions(seq, cp, source)
            mask = kpos[None, :] <= qpos[:, None]
            block = visible_block(rank, source, cp)
            expected = torch.zeros_like(mask)
            rows = slice(2 * block.query_halves.start, 2 * block.query_halves.stop)
            cols = slice(2 * block.key_halves.start, 2 * block.key_halves.stop)
            inside = torch.ones(rows.stop - rows.start, cols.stop - cols.start, dtype=torch.bool)
            expected[rows, cols] = inside.tril() if block.causal else inside
            assert torch.equal(mask, expected), (rank, source)


@pytest.mark.parametrize(("m", "n", "causal"), [(6, 6, True), (6, 6, False), (3, 6, False), (6, 3, False)])
def test_block_kernels_agree(m: int, n: int, causal: bool) -> None:
    """The CPU flash kernel and the matmul math (the one other devices run) give one block's output,
    lse and gradients alike, the gradients from an output and lse that are not the block's own."""
    gen = torch.Generator().manual_seed(0)
    q, go, out = (torch.randn(2, 3, m, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    k, v = (torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    lse = torch.randn(2, 3, m, generator=gen, dtype=torch.float64) + 3.0
    flash = block_attention(q, k, v, causal=causal, flash=True)
    matmul = block_attention(q, k, v, causal=causal, flash=False)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (flash[0] - expected).abs().max() < 1e-12 and (matmul[0] - expected).abs().max() < 1e-12
    assert (flash[1] - matmul[1]).abs().max() < 1e-12
    grads = [block_attention_backward(go, q, k, v, out, lse, causal=causal, flash=f) for f in (True, False)]
    for a, b in zip(*grads, strict=True):
        assert a.abs().max() > 1e-3 and (a - b).abs().max() < 1e-12


def ring_traffic_bytes(
    *,
    batch_size: int,
    kv_heads: int,
    seq_len: int,
    head_dim: int,
    cp: int,
    element_bytes: int,
    gradient_element_bytes: int,
) -> SentBytes:
    """What one rank sends in one ring attention call: forward, its k/v block (b kv_heads s/cp d,
    twice: k and v) to the next rank cp - 1 times; backward the block again cp - 1 times, and the
    dk/dv accumulator cp - 1 times in the gradients' precision."""
    block = 2 * batch_size * kv_heads * (seq_len // cp) * head_dim
    steps = cp - 1
    return SentBytes(
        forward_bytes=steps * block * element_bytes,
        backward_bytes=steps * block * (element_bytes + gradient_element_bytes),
    )


def test_traffic_by_hand() -> None:
    # b 2, 2 kv heads, s 16 over cp 4 (4 tokens a rank), d 8: a k/v block is 2*2*2*4*8 = 256 elements.
    t = ring_traffic_bytes(
        batch_size=2, kv_heads=2, seq_len=16, head_dim=8, cp=4, element_bytes=2, gradient_element_bytes=4
    )
    assert (t.forward_bytes, t.backward_bytes) == (3 * 256 * 2, 3 * 256 * (2 + 4))
    assert t.total_bytes == 6144
    one = ring_traffic_bytes(
        batch_size=2, kv_heads=2, seq_len=16, head_dim=8, cp=1, element_bytes=2, gradient_element_bytes=4
    )
    assert one.total_bytes == 0


# (batch, heads, kv_heads, seq_len per 2 cp chunks, head_dim, dtype, causal)
CASES = [
    (2, 4, 4, 1, 8, "float64", True),
    (1, 4, 2, 3, 16, "float64", True),
    (2, 6, 2, 2, 4, "float64", True),
    (1, 8, 1, 4, 32, "float64", True),
    (2, 4, 2, 2, 8, "float32", True),
    (1, 4, 2, 2, 8, "float64", False),
    (1, 4, 2, 2, 8, "bfloat16", True),
]


def _compare(cases: list[tuple[Any, ...]], cp_groups: list[list[int]]) -> list[dict[str, float]]:
    """Runs on every rank: each case's largest differences from whole-sequence SDPA (in float32 for
    bf16 inputs) over all ranks, and whether every rank's counted bytes equal ``ring_traffic_bytes``.
    The world is cut into the context-parallel groups ``cp_groups``, each computing every case."""
    groups = [dist.new_group(ranks) for ranks in cp_groups]  # every rank creates every group
    group = next(g for g, ranks in zip(groups, cp_groups, strict=True) if dist.get_rank() in ranks)
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    results = []
    for i, (b, h, hk, per_chunk, d, dtype_name, causal) in enumerate(cases):
        s = 2 * cp * per_chunk
        (q, k, v, dout), ref, full = whole_sequence_attention(i, (b, h, hk, s, d), DTYPES[dtype_name], causal)
        local = [split_sequence(t, cp, rank, dim=2).requires_grad_() for t in (q, k, v)]
        sent = SentBytes()
        out = ring_attention(*local, group, causal=causal, sent=sent)
        out.backward(split_sequence(dout, cp, rank, dim=2))
        errors = [
            (gather_sequence(mine.detach().contiguous(), group, dim=2).to(theirs.dtype) - theirs).abs().max()
            for mine, theirs in zip([out, *(t.grad for t in local)], [ref, *(t.grad for t in full)], strict=True)
        ]
        expected = ring_traffic_bytes(
            batch_size=b,
            kv_heads=hk,
            seq_len=s,
            head_dim=d,
            cp=cp,
            element_bytes=k.element_size(),
            gradient_element_bytes=max(k.element_size(), 4),
        )
        wrong_bytes = (sent.forward_bytes, sent.backward_bytes) != (expected.forward_bytes, expected.backward_bytes)
        results.append(worst_over_ranks(errors, wrong_bytes))
        print(f"rank {rank} case {i}: errors {results[-1]} sent {sent} expected {expected}", flush=True)
    return results


@pytest.mark.distributed
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_equals_full_attention(cp: int, tmp_path: Path) -> None:
    assert_close_to_whole(CASES, run_ranks(cp, _compare, CASES, [list(range(cp))], workdir=tmp_path))


@pytest.mark.distributed
def test_ring_attention_on_strided_sub_groups(tmp_path: Path) -> None:
    """Two cp groups of 2 in a world of 4, {0, 2} and {1, 3}, as a cp axis outside another axis of
    a mesh lays them out: the ring's neighbours are global ranks 2 apart."""
    assert_close_to_whole(CASES[:3], run_ranks(4, _compare, CASES[:3], [[0, 2], [1, 3]], workdir=tmp_path))


def _refuse(workdir: str) -> str:
    group = dist.group.WORLD
    assert group is not None
    try:
        ring_attention(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), group)
    except InfeasibleConfigError as e:
        return str(e)
    return "accepted"


@pytest.mark.distributed
def test_ring_attention_refuses_an_odd_share(tmp_path: Path) -> None:
    message = run_ranks(2, _refuse, str(tmp_path), workdir=tmp_path)
    assert "seq_len=6 is not divisible by 4" in message


def _attention_layer(workdir: str) -> dict[str, float]:
    """Runs on every rank: the model's attention layer (rotary, GQA, float64) on the whole sequence,
    and on this rank's share with rotary at ``zigzag_positions`` and ring attention; the largest
    differences of the summed loss and of the weight gradients (summed over the cp ranks)."""
    group = dist.group.WORLD
    assert group is not None
    cp, rank = dist.get_world_size(), dist.get_rank()
    spec = load_model("tiny-gpt").model_copy(
        update={"position_embedding_type": PositionEmbedding.ROPE, "num_key_value_heads": 2}
    )
    torch.manual_seed(0)
    layer = Attention(spec).double()
    b, s = 2, 8 * cp
    x, weights = (
        torch.randn(b, s, spec.hidden_size, dtype=torch.float64),
        torch.randn(b, s, spec.hidden_size, dtype=torch.float64),
    )
    reference = (layer(x) * weights).sum()
    reference_grads = torch.autograd.grad(reference, list(layer.parameters()))

    local_x, positions = split_sequence(x, cp, rank, dim=1), zigzag_positions(s, cp, rank)
    q, k, v = (p(local_x).view(b, s // cp, -1, layer.head_dim).transpose(1, 2) for p in (layer.q, layer.k, layer.v))
    out = ring_attention(rotary(q, positions), rotary(k, positions), v, group)
    local_out = layer.o(out.transpose(1, 2).reshape(b, s // cp, -1))
    loss = (local_out * split_sequence(weights, cp, rank, dim=1)).sum()
    grads = torch.autograd.grad(loss, list(layer.parameters()))
    loss = loss.detach()
    for t in (loss, *grads):
        dist.all_reduce(t)
    grad_error = max((g - r).abs().max().item() for g, r in zip(grads, reference_grads, strict=True))
    return {"loss": abs(loss.item() - reference.item()), "grads": grad_error, "scale": abs(reference.item())}


@pytest.mark.distributed
def test_attention_layer_with_rotary_matches_the_whole_sequence(tmp_path: Path) -> None:
    """How a trainer uses the module: split the sequence, rotate at the held positions, attend on
    the ring; the loss and the weight gradients (summed over the cp ranks) are the reference's."""
    r = run_ranks(2, _attention_layer, str(tmp_path), workdir=tmp_path)
    assert r["scale"] > 1.0
    assert r["loss"] < 1e-10 and r["grads"] < 1e-10, r
