"""Context parallelism trains like the single-process reference: each rank holds a zig-zag share
of every sequence (1,024 tokens here; a contiguous share under the all-to-all kind), and the
losses of the first steps match within 1e-5 (SGD, float32 on CPU), alone and beside data, tensor
and pipeline parallelism (issue 20's acceptance)."""

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import run_ranks

from planner.inputs import load_model
from planner.schemas import Layout, ModelSpec
from runtime.data import synthetic_batch
from runtime.reference import reference_losses
from runtime.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

TOLERANCE = 1e-5
BATCH, SEQ, STEPS, SEED, LR = 4, 1024, 2, 0, 0.1
GPT = load_model("tiny-gpt").model_copy(update={"max_position_embeddings": SEQ})  # learned positions, tied embeddings
LLAMA = ModelSpec(  # rotary, grouped-query attention, untied
    name="tiny-llama",
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    hidden_act="silu",
    tie_word_embeddings=False,
    max_position_embeddings=SEQ,
)


def L(d: int, cp: int, t: int = 1, p: int = 1, b: int = 1, **kw: Any) -> dict[str, Any]:
    return dict(
        data_parallel_degree=d,
        context_parallel_degree=cp,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=b,
        **kw,
    )


@functools.cache
def reference_of(model: ModelSpec, seq: int) -> list[float]:
    return reference_losses(model, global_batch_size=BATCH, seq_len=seq, steps=STEPS, seed=SEED, optimizer="sgd", lr=LR)


def train(model: ModelSpec, layouts: list[dict[str, Any]], seq: int) -> list[list[float]]:
    results = []
    for kw in layouts:
        trainer = Trainer(
            model, Layout(**kw), global_batch_size=BATCH, seed=SEED, optimizer="sgd", lr=LR, device=torch.device("cpu")
        )
        losses = []
        for step in range(STEPS):
            inputs, targets = synthetic_batch(model.vocab_size, BATCH, seq, step=step, seed=SEED)
            losses.append(trainer.step(inputs, targets))
        results.append(losses)
    return results


def check(model: ModelSpec, world: int, layouts: list[dict[str, Any]], tmp_path: Path, seq: int = SEQ) -> None:
    reference = reference_of(model, seq)
    results = run_ranks(world, train, model, layouts, seq, workdir=tmp_path)
    for kw, losses in zip(layouts, results, strict=True):
        assert losses == pytest.approx(reference, abs=TOLERANCE), kw
    assert len(set(reference)) == STEPS


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
