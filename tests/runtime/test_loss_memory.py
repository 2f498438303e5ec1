"""The runtime's cross-entropy: torch's values and gradients, and one fp32 copy of the logits
kept for the backward (what ``cost_models.loss_memory.stage_logits_bytes`` prices); the fp32 master
slices of mixed-precision AdamW."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed._tools.mem_tracker import MemTracker

from runtime.loss import cross_entropy
from runtime.optim import MASTER_SLICE_ELEMENTS, _contiguous_owners, _master_slices, _pieces, _runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_matches_torch(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 50, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 50, (2, 16))
    ours = cross_entropy(logits, targets)
    ours.backward()
    assert logits.grad is not None
    grad = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(grad, logits.grad, atol=1e-6 if dtype is torch.float32 else 1e-3, rtol=0)


def test_cross_entropy_keeps_one_fp32_copy() -> None:
    tokens, vocab = 256, 8192
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    tracker = MemTracker()  # type: ignore[no-untyped-call]
    with tracker:
        loss = cross_entropy(logits * 1, targets)  # the product is the logits tensor a head returns
        loss.backward()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    fp32_copy = 4 * tokens * vocab
    # Traced: the bf16 product (half a copy) and the kept fp32 softmax, which becomes the gradient
    # in place: 1.5 copies. torch's F.cross_entropy over logits.float() traces 3 (its backward
    # adds the fp32 gradients of nll_loss and of log_softmax). The cost model prices 2.
    assert peak["Total"] <= 2 * fp32_copy


def test_master_slices_cover_each_parameter_once() -> None:
    big = torch.nn.Parameter(torch.zeros(MASTER_SLICE_ELEMENTS + 10, dtype=torch.bfloat16))
    small = torch.nn.Parameter(torch.ones(7, dtype=torch.bfloat16))
    groups = _master_slices([big, small])
    assert [[(s.start, s.stop) for s in g] for g in groups] == [
        [(0, MASTER_SLICE_ELEMENTS)],
        [(MASTER_SLICE_ELEMENTS, MASTER_SLICE_ELEMENTS + 10), (0, 7)],
    ]
    assert all(s.master.dtype == torch.float32 for g in groups for s in g)


def test_zero_1_shares_the_masters_evenly_whatever_the_parameters_sizes() -> None:
    # An embedding of 10 slices and 6 parameters of one slice over 4 ranks: 16 slices, 4 each
    # (by whole parameters the embedding's owner held 10 of them).
    meta = torch.device("meta")
    big = torch.nn.Parameter(torch.empty(10 * MASTER_SLICE_ELEMENTS, dtype=torch.bfloat16, device=meta))
    small = [
        torch.nn.Parameter(torch.empty(MASTER_SLICE_ELEMENTS, dtype=torch.bfloat16, device=meta)) for _ in range(6)
    ]
    pieces = _pieces([big, *small])
    owners = _contiguous_owners([p.stop - p.start for p in pieces], 4)
    assert owners == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4  # consecutive shares
    assert sum(p.stop - p.start for p in pieces) == 16 * MASTER_SLICE_ELEMENTS
    # each share's updates go out as runs: the embedding's slices joined, one run per small parameter
    runs = [_runs([p for p, o in zip(pieces, owners, strict=True) if o == rank]) for rank in range(4)]
    assert [[(r.param is big, r.start, r.stop) for r in share] for share in runs[:2]] == [
        [(True, 0, 4 * MASTER_SLICE_ELEMENTS)],
        [(True, 4 * MASTER_SLICE_ELEMENTS, 8 * MASTER_SLICE_ELEMENTS)],
    ]
    assert [len(share) for share in runs[2:]] == [3, 4]  # the embedding's last two slices, then small ones


@given(st.lists(st.integers(1, 5 * MASTER_SLICE_ELEMENTS), min_size=1, max_size=40), st.integers(1, 16))
def test_contiguous_shares_are_within_one_piece_of_even(sizes: list[int], parts: int) -> None:
    owners = _contiguous_owners(sizes, parts)
    assert owners == sorted(owners) and all(0 <= o < parts for o in owners)
    loads = [sum(s for s, o in zip(sizes, owners, strict=True) if o == d) for d in range(parts)]
    assert max(loads) <= sum(sizes) / parts + max(sizes)
