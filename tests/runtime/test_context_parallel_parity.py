"""Context parallelism trains like the single-process reference: each rank holds a zig-zag share
of every sequence (1,024 tokens here; a contiguous share under the all-to-all kind), and the
losses of the first steps match within 1e-5 (SGD, float32 on CPU), alone and beside data, tensor
and pipeline parallelism."""

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from harness import TINY_LLAMA, Setting, check_parity

from planner.files.models import load_model
from planner.schemas import ModelSpec

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

SETTING = Setting(batch=4, seq_len=1024, steps=2)
GPT = load_model("tiny-gpt").model_copy(update={"max_position_embeddings": SETTING.seq_len})  # learned, tied
LLAMA = TINY_LLAMA.model_copy(update={"max_position_embeddings": SETTING.seq_len})  # rotary, GQA, untied


def L(d: int, cp: int, t: int = 1, p: int = 1, b: int = 1, **kw: Any) -> dict[str, Any]:
    return dict(
        data_parallel_degree=d,
        context_parallel_degree=cp,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=b,
        **kw,
    )


def check(
    model: ModelSpec, world: int, layouts: list[dict[str, Any]], tmp_path: Path, seq: int = SETTING.seq_len
) -> None:
    """``check_parity`` in this test's setting, at sequences of ``seq`` tokens."""
    check_parity(model, world, layouts, tmp_path, dataclasses.replace(SETTING, seq_len=seq))


def test_two_context_ranks(tmp_path: Path) -> None:
    check(GPT, 2, [L(1, 2), L(1, 2, b=2, zero_stage=3, recompute="full")], tmp_path / "gpt")
    check(LLAMA, 2, [L(1, 2, recompute="selective")], tmp_path / "llama")


MOE = load_model("tiny-moe")  # its own 256 positions: every token's experts run on the CPU


def test_context_beside_expert_parallelism(tmp_path: Path) -> None:
    # the experts split over the d cp data axis: their tokens are the ranks' sequence shares
    check(MOE, 2, [L(1, 2), L(1, 2, expert_parallel_degree=2)], tmp_path / "moe", seq=256)


def test_context_beside_data_tensor_and_pipeline(tmp_path: Path) -> None:
    layouts = [
        L(1, 4),
        L(2, 2, zero_stage=1),
        L(1, 2, t=2, sequence_parallel=True),
        L(1, 2, p=2),
    ]
    check(LLAMA, 4, layouts, tmp_path / "llama")
    check(GPT, 4, [L(1, 2, t=2), L(1, 2, p=2)], tmp_path / "gpt")


A2A = {"context_parallel_kind": "all-to-all"}  # DeepSpeed-Ulysses: a contiguous split, heads over the cp ranks


def test_all_to_all_context_parallelism(tmp_path: Path) -> None:
    # learned positions over the contiguous split; the attention core recomputed, its all-to-alls with it
    check(GPT, 2, [L(1, 2, **A2A), L(1, 2, recompute="selective", **A2A)], tmp_path / "gpt")
    layouts = [
        L(2, 2, zero_stage=1, **A2A),
        L(1, 2, t=2, sequence_parallel=True, **A2A),  # a tp rank's one kv head repeated for both cp ranks
        L(1, 4, **A2A),  # 2 kv heads repeated for 4 ranks
    ]
    check(LLAMA, 4, layouts, tmp_path / "llama")
