"""Experts split over the tensor-parallel group (expert-tensor parallelism equal to tp,
``runtime.tensor_parallel``): tiny-moe trains like the single-process reference on 4 ranks
(losses within the MoE parity tests' 1e-5 in fp32 with SGD, 1e-3 in bf16) under tp2 x dp2,
with expert parallelism, sequence parallelism, a pipeline, full recompute and ZeRO-3; each
tensor-parallel rank holds half of every expert's matrices, and the halves of the trained
experts (and the routers, whose gradients are partial per rank) equal the reference's."""

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from moe_training import MOE, STEPS, TOLERANCE, layout_of, moe_trainer, train_losses, train_reference
from torch.distributed.tensor import DTensor

from planner.schemas import Activation, DType
from planner.schemas.geometry import MeshAxis
from runtime.model import MLP
from runtime.tensor_parallel import split_expert

WEIGHT_TOLERANCE = 1e-6

FP32 = [
    dict(data_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, sequence_parallel=True),
    dict(data_parallel_degree=1, pipeline_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=2, zero_stage=3),
    dict(data_parallel_degree=2, zero_stage=3, recompute="full"),
    dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=1, sequence_parallel=True),
]
"""tp2 layouts trained in fp32 (every one on 4 ranks: dp x pp x 2)."""

BF16 = [
    dict(data_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, zero_stage=3, sequence_parallel=True),
]
"""tp2 layouts trained in bf16 mixed precision."""


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter's tensor-parallel part, whole over the data-parallel group (FSDP's shards gathered)."""
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().clone()


def train(out: str) -> list[list[float]]:
    """Each layout's losses (runs on every rank); rank 0 saves, per fp32 layout, every expert's
    and router's parameters as each tensor-parallel rank holds them (from the first replica
    holding them) and the shapes each rank holds."""
    results = []
    cases = [(kw, DType.FP32) for kw in FP32] + [(kw, DType.BF16) for kw in BF16]
    for i, (kw, dtype) in enumerate(cases):
        trainer = moe_trainer(layout_of(kw, tensor_parallel_degree=2), dtype=dtype)
        results.append(train_losses(trainer))
        if dtype is not DType.FP32:
            continue
        held = {
            name: _whole(p)
            for chunk in trainer.chunks
            for name, p in chunk.named_parameters()
            if ".mlp.experts." in name or ".mlp.router." in name
        }
        mine = (trainer.mesh[MeshAxis.TP].get_local_rank(), trainer.dp_rank, held)
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            torch.save(everyone, Path(out) / f"experts{i}.pt")
    return results


def _reassemble(everyone: list[tuple[int, int, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """Every expert and router parameter whole: an expert's gate/up rows and down columns joined in
    tensor-parallel rank order, from the first data-parallel replica holding it; the router of
    tensor-parallel rank 0, after checking every rank holds the same."""
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for tp_rank, _, held in sorted(everyone, key=lambda e: (e[1], e[0])):
        for name, p in held.items():
            first = parts.setdefault(name, {}).setdefault(tp_rank, p)
            assert torch.equal(first, p), name  # the data-parallel replicas agree
    whole = {}
    for name, shards in parts.items():
        if ".router." in name:
            assert torch.equal(shards[0], shards[1]), name  # every tensor-parallel rank, the same router
            whole[name] = shards[0]
        else:
            whole[name] = torch.cat([shards[0], shards[1]], dim=1 if ".down." in name else 0)
    return whole


@pytest.mark.parametrize("act", [Activation.SILU, Activation.GELU])
def test_the_parts_of_a_split_expert_sum_to_the_whole_expert(act: Activation) -> None:
    # gated (gate, up, down) and ungated (up, down) experts with biases, split over 4 ranks: the
    # parts' outputs sum to the whole expert's (down's bias counted once, by rank 0)
    model = MOE.model_copy(update={"hidden_act": act, "mlp_bias": True})
    torch.manual_seed(0)
    whole = MLP(model).double()  # float64: only the order of the sums differs
    with torch.no_grad():
        for p in whole.parameters():
            p.normal_()
    x = torch.randn(5, model.hidden_size, dtype=torch.float64)
    parts = []
    for rank in range(4):
        part = MLP(model).double()
        part.load_state_dict(whole.state_dict())
        split_expert(part, rank, 4)
        assert part.up.weight.shape == (model.intermediate_size // 4, model.hidden_size)
        assert part.down.weight.shape == (model.hidden_size, model.intermediate_size // 4)
        assert (part.down.bias is not None) == (rank == 0)
        parts.append(part(x))
    torch.testing.assert_close(sum(parts), whole(x), atol=1e-9, rtol=1e-12)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_experts_split_over_tensor_parallel_ranks_match_the_reference(tmp_path: Path) -> None:
    reference, net = train_reference()
    assert len(set(reference)) == STEPS  # the steps do update the parameters
    results = run_ranks(4, train, str(tmp_path), workdir=tmp_path)
    for kw, losses in zip(FP32, results[: len(FP32)], strict=True):
        assert losses == pytest.approx(reference, abs=TOLERANCE), kw
    for kw, losses in zip(BF16, results[len(FP32) :], strict=True):
        assert losses == pytest.approx(reference, abs=1e-3), kw
    trained = {n: p.detach() for n, p in net.named_parameters() if ".mlp.experts." in n or ".mlp.router." in n}
    f, h = MOE.intermediate_size, MOE.hidden_size
    for i, kw in enumerate(FP32):
        everyone = torch.load(tmp_path / f"experts{i}.pt")
        for _, _, held in everyone:  # each rank: half of each expert it holds, gate/up rows and down columns
            for name, p in held.items():
                if ".mlp.experts." in name:
                    assert tuple(p.shape) == ((h, f // 2) if ".down." in name else (f // 2, h)), (kw, name)
        whole = _reassemble(everyone)
        assert whole.keys() == trained.keys(), kw
        for name, p in trained.items():
            error = float((whole[name] - p).abs().max())
            assert error <= WEIGHT_TOLERANCE, (kw, name, error)
