"""MoE models shaped as the Hugging Face families plan them train like the single-process
reference on 4 ranks (SGD, float32 on CPU), both models' layouts in one launch:

- a DeepSeek-shaped model: multi-head latent attention (a query rank, value heads narrower than
  the query/key heads), experts narrower than the dense MLP (moe_intermediate_size), two
  shared experts (one MLP, no gate), a first dense layer (first_k_dense_replace) and
  group-limited routing (n_group, topk_group);
- a Qwen-MoE-shaped model: narrower experts, a shared expert wider than them scaled by its
  sigmoid gate, a dense layer among the MoE ones (mlp_only_layers), q/k/v biases and q/k norms.

Layouts: expert parallelism (whose placement rows are the MoE layers only), over a pipeline whose
first stage holds the dense layer, tensor parallelism with and without sequence parallelism (the
shared expert split as a dense MLP, latent attention's up-projections by heads; the gate's, the q/k
norms' and the latent down-projections' partial gradients summed) and
with the experts folded, ZeRO-1 and the MoE block recomputed. After training, every parameter a
rank holds whole (a DTensor gathered; the experts split by hand over tp left out) must equal the
reference's: the last update is one no loss sees. A checkpoint saved under tp2 with sequence
parallelism and ep2 resumes under dp4 ep4 (shared experts, gates and q/k norms keep their names)
and computes the next step as the uninterrupted run does. Under tensor parallelism each rank
holds the attention parameters the cost model counts for it."""

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import run_ranks
from moe_training import BATCH, LR, MOE, SEED, SEQ, TOLERANCE, layout_of
from torch.distributed.tensor import DTensor

from cost_models.params import layer_params, total_params
from planner.schemas import ModelSpec
from runtime import checkpoint
from runtime.data import synthetic_batch
from runtime.mlp import MLP, MoE
from runtime.model import Block, Decoder
from runtime.reference import reference_training
from runtime.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 3
WEIGHT_TOLERANCE = 1e-5

TINY_DEEPSEEK = ModelSpec(
    **{
        **MOE.model_dump(),
        "name": "tiny-deepseek",
        "moe_intermediate_size": 64,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "num_key_value_heads": 4,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 24,
    }
)
TINY_QWEN_MOE = ModelSpec(
    **{
        **MOE.model_dump(),
        "name": "tiny-qwen-moe",
        "moe_intermediate_size": 96,
        "shared_expert_intermediate_size": 192,
        "mlp_only_layers": (2,),
        "qkv_bias": True,
        "qk_norm": True,
    }
)
MODELS = {m.name: m for m in (TINY_DEEPSEEK, TINY_QWEN_MOE)}

LAYOUTS: list[dict[str, Any]] = [
    dict(data_parallel_degree=4, expert_parallel_degree=2),
    dict(
        data_parallel_degree=4, expert_parallel_degree=4, zero_stage=1, recompute="selective", recompute_modules=["moe"]
    ),
    dict(data_parallel_degree=2, pipeline_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, sequence_parallel=True),
    dict(
        data_parallel_degree=2,
        tensor_parallel_degree=2,
        expert_parallel_degree=2,
        sequence_parallel=True,
        expert_tensor_parallel_degree=1,
    ),
]
"""Layouts on 4 ranks, each trained for both models."""


@functools.cache
def _reference(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses, net = reference_training(
        MODELS[name], global_batch_size=BATCH, seq_len=SEQ, steps=STEPS, seed=SEED, optimizer="sgd", lr=LR
    )
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def _attention_params(trainer: Trainer) -> int:
    """The attention parameters this rank holds of its first layer (its own rows of split ones)."""
    chunk = trainer.chunks[0]
    block = next(iter(chunk.layers.values()))
    assert isinstance(block, Block)
    held = block.attn.parameters()
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in held)


def _weight_error(trainer: Trainer, reference: dict[str, torch.Tensor]) -> float:
    """The largest difference between a parameter this rank holds whole and the reference's;
    experts split by hand over the tensor-parallel group are left out."""
    split = trainer.layout.tensor_parallel_degree > 1 and not trainer.layout.folds_experts
    worst = 0.0
    for chunk in trainer.chunks:
        for name, p in chunk.named_parameters():
            if split and ".mlp.experts." in name:
                continue
            whole = p.full_tensor() if isinstance(p, DTensor) else p
            worst = max(worst, float((whole.detach() - reference[name]).abs().max()))
    return worst


SAVED_UNDER, RESUMED_UNDER = LAYOUTS[4], dict(data_parallel_degree=4, expert_parallel_degree=4)
"""A checkpoint's layouts: tp2 x dp2 with sequence parallelism and ep2, then dp4 ep4."""


def _trainer(model: ModelSpec, kw: dict[str, Any], optimizer: str = "sgd") -> Trainer:
    return Trainer(
        model, layout_of(kw), global_batch_size=BATCH, seed=SEED, optimizer=optimizer, lr=LR, device=torch.device("cpu")
    )


def _steps(trainer: Trainer, first: int, last: int) -> list[float]:
    model = trainer.model
    return [trainer.step(*synthetic_batch(model.vocab_size, BATCH, SEQ, step=s, seed=SEED)) for s in range(first, last)]


def train_shapes(workdir: str) -> dict[str, Any]:
    """Each (model, layout)'s losses and its ranks' largest weight error, and each model's
    checkpoint's losses uninterrupted and resumed (runs on every rank)."""
    import torch.distributed as dist

    results: dict[str, Any] = {}
    for name, model in MODELS.items():
        _, reference = _reference(name)
        for i, kw in enumerate(LAYOUTS):
            trainer = _trainer(model, kw)
            losses = _steps(trainer, 0, STEPS)
            errors: list[float] = [0.0] * dist.get_world_size()
            dist.all_gather_object(errors, _weight_error(trainer, reference))
            counts: list[int] = [0] * dist.get_world_size()
            dist.all_gather_object(counts, _attention_params(trainer))
            results[f"{name}/{i}"] = {"losses": losses, "weight_error": max(errors), "attention_params": counts}
        saved, directory = _trainer(model, SAVED_UNDER, "adamw"), Path(workdir) / name
        whole = _steps(saved, 0, 2)
        checkpoint.save(saved, directory, 2, plan_sha256="before")
        whole += _steps(saved, 2, STEPS)
        resumed = _trainer(model, RESUMED_UNDER, "adamw")
        checkpoint.resume(resumed, directory, plan_sha256="after")
        results[f"{name}/checkpoint"] = {"whole": whole[2:], "resumed": _steps(resumed, 2, STEPS)}
    return results


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("shapes")
    result: dict[str, Any] = run_ranks(4, train_shapes, str(workdir), workdir=workdir)
    return result


@pytest.mark.parametrize("layout", range(len(LAYOUTS)), ids=lambda i: "-".join(f"{v}" for v in LAYOUTS[i].values()))
@pytest.mark.parametrize("name", list(MODELS))
def test_planned_moe_shapes_train_like_the_reference(trained: dict[str, Any], name: str, layout: int) -> None:
    losses, _ = _reference(name)
    got = trained[f"{name}/{layout}"]
    assert got["losses"] == pytest.approx(losses, abs=TOLERANCE)
    assert got["weight_error"] < WEIGHT_TOLERANCE


@pytest.mark.parametrize("layout", [i for i, kw in enumerate(LAYOUTS) if kw.get("tensor_parallel_degree", 1) > 1])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_tensor_parallel_rank_holds_the_attention_the_cost_model_counts(
    trained: dict[str, Any], name: str, layout: int
) -> None:
    tp = LAYOUTS[layout]["tensor_parallel_degree"]
    expected = layer_params(MODELS[name], tensor_parallel_degree=tp).attention
    assert trained[f"{name}/{layout}"]["attention_params"] == [expected] * 4


@pytest.mark.parametrize("name", list(MODELS))
def test_a_checkpoint_resumes_under_another_layout(trained: dict[str, Any], name: str) -> None:
    got = trained[f"{name}/checkpoint"]
    assert got["resumed"] == pytest.approx(got["whole"], abs=TOLERANCE)


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_the_decoder_holds_the_parameters_the_cost_model_counts(model: ModelSpec) -> None:
    net = Decoder(model, seed=0)
    assert sum(p.numel() for p in net.parameters()) == total_params(model)
    dense = [i for i in range(model.num_hidden_layers) if not model.is_moe_layer(i)]
    assert dense and all(f"layers.{i}.mlp.up.weight" in dict(net.named_parameters()) for i in dense)
    moe = net.layers[str(model.num_hidden_layers - 1)].mlp
    assert isinstance(moe, MoE)
    expert = moe.experts["0"]
    assert isinstance(expert, MLP) and expert.up.out_features == model.expert_ffn_size != model.ffn_size
