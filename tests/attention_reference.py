"""The whole-sequence reference the context-parallel attention tests compare with: random q, k,
v and output gradient for one case, and F.scaled_dot_product_attention's output and q/k/v
gradients on the whole sequence (in float32 for bf16 inputs); and the per-case worst errors over
all ranks."""

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
TOLERANCES = {"float64": 1e-12, "float32": 2e-6, "bfloat16": 3e-2}
"""Largest difference from the reference per input dtype (cases name it sixth)."""


def whole_sequence_attention(
    seed: int, shape: tuple[int, int, int, int, int], dtype: torch.dtype, causal: bool
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, list[torch.Tensor]]:
    """For ``shape`` (batch, heads, kv heads, sequence, head dim): the inputs (q, k, v, dout)
    drawn from ``seed``, the reference output, and its leaves (q, k, v) holding their gradients."""
    b, h, hk, s, d = shape
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(
        torch.randn(size, generator=gen, dtype=dtype)
        for size in ((b, h, s, d), (b, hk, s, d), (b, hk, s, d), (b, h, s, d))
    )
    full = [t.clone().to(torch.promote_types(dtype, torch.float32)).requires_grad_() for t in inputs[:3]]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal, enable_gqa=h != hk)
    ref.backward(inputs[3].to(ref.dtype))
    return inputs, ref, full


def worst_over_ranks(errors: Sequence[torch.Tensor], wrong_bytes: bool) -> dict[str, float]:
    """The largest output, dq, dk and dv errors over every rank, and whether any rank counted
    other bytes than expected (1.0) or none did (0.0)."""
    stats = torch.stack([e.to(torch.float64) for e in (*errors, torch.tensor(float(wrong_bytes)))])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    return dict(zip(["out", "dq", "dk", "dv", "wrong_bytes"], stats.tolist(), strict=True))


def assert_close_to_whole(cases: Sequence[tuple[object, ...]], results: Sequence[dict[str, float]]) -> None:
    """Each case's worst errors within its dtype's tolerance, and every rank's counted bytes right."""
    for case, r in zip(cases, results, strict=True):
        assert max(r["out"], r["dq"], r["dk"], r["dv"]) < TOLERANCES[str(case[5])], (case, r)
        assert r["wrong_bytes"] == 0.0, (case, r)
