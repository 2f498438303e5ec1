"""Folded experts (expert tensor parallelism 1 under tp2 with sequence parallelism, Megatron-Core's
MoE parallel folding): tiny-moe trains like the single-process reference on 4 ranks. Each rank
routes its own quarter (tp2 x dp2) of the batch's tokens and exchanges them over an
expert-parallel group of consecutive stage ranks (ep 2 and 4, so a group mixes tensor shards and
replicas); the experts stay whole, and after training every expert and router a rank holds
equals the reference's, which checks the experts' gradient divisor (d, not the edp group's
d t / ep) and the routers' sum over the tensor-parallel ranks. Permuted, per-layer and replicated
placement tables, ep 1 (every expert on every rank, reduced over the whole stage), a pipeline,
ZeRO-1 and ZeRO-3 with full recompute, and bf16."""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from moe_training import (
    BATCH,
    MOE,
    SEQ,
    STEPS,
    TOLERANCE,
    batch,
    layout_of,
    moe_trainer,
    reference_routing,
    train_losses,
    train_reference,
)
from torch.distributed.tensor import DTensor

from planner.schemas import DType
from runtime.expert_parallel import PlacementTable
from runtime.routing_trace import gather_routing, record_routing
from runtime.trainer import Trainer

WEIGHT_TOLERANCE = 1e-6

SHUFFLED: PlacementTable = (((0, 3), (1, 2)), ((2, 1), (3, 0)), ((1, 2), (0, 3)), ((3, 0), (2, 1)))
"""ep 2: every layer its own non-contiguous placement, experts out of order within a rank."""

PERMUTED: PlacementTable = (
    ((2,), (0,), (3,), (1,)),
    ((1,), (3,), (0,), (2,)),
    ((3,), (2,), (1,), (0,)),
    ((0,), (1,), (2,), (3,)),
)
"""ep 4: one expert a rank, a different permutation in each layer."""

REPLICATED: PlacementTable = (((0, 1, 2), (0, 3)), ((1, 3), (2, 0, 3)), ((0, 1), (2, 3)), ((3, 2, 1), (0, 1)))
"""ep 2: some layers with experts on both ranks (uneven counts), one layer without replicas."""

FOLDED = {"tensor_parallel_degree": 2, "sequence_parallel": True, "expert_tensor_parallel_degree": 1}

FP32: list[tuple[dict[str, Any], PlacementTable | None]] = [
    (dict(data_parallel_degree=2, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=2, expert_parallel_degree=4), PERMUTED),
    (dict(data_parallel_degree=2, expert_parallel_degree=2, zero_stage=1), REPLICATED),
    (dict(data_parallel_degree=2, expert_parallel_degree=1), None),
    (dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=2, expert_parallel_degree=4, zero_stage=3, recompute="full"), None),
]
"""Folded tp2 layouts on 4 ranks trained in fp32, with their placement tables (None: contiguous)."""

TRACED: list[dict[str, Any]] = [
    dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=4, micro_batch_size=2),
]
"""Folded layouts whose first step's routing trace (each rank's slice of the sequence, joined) is
compared with the reference's routing; the pipeline's also records shape inference's placeholders."""

BF16: list[dict[str, Any]] = [dict(data_parallel_degree=2, expert_parallel_degree=4)]
"""Folded tp2 layouts trained in bf16 mixed precision (within bf16 rounding, 1e-3)."""


def _held(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The experts and routers this rank holds, whole (a router sharded by ZeRO-3 gathered)."""
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for chunk in trainer.chunks
        for name, p in chunk.named_parameters()
        if ".mlp.experts." in name or ".mlp.router." in name
    }


def train(out: str) -> dict[str, Any]:
    """Each layout's losses (every rank); rank 0 saves, per fp32 layout, what every rank holds of
    the experts and routers after training, and the experts each rank holds."""
    losses = []
    for i, (kw, table) in enumerate(FP32):
        trainer = moe_trainer(layout_of({**FOLDED, **kw}), table)
        losses.append(train_losses(trainer))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, _held(trainer))
        if dist.get_rank() == 0:
            torch.save(everyone, Path(out) / f"held{i}.pt")
    for kw in BF16:
        losses.append(train_losses(moe_trainer(layout_of({**FOLDED, **kw}), dtype=DType.BF16)))
    traces = []
    for kw in TRACED:
        trainer = moe_trainer(layout_of({**FOLDED, **kw}))
        record_routing(trainer)
        trainer.step(*batch(0))
        ids = gather_routing(trainer, BATCH // kw["data_parallel_degree"] * SEQ)
        traces.append(None if ids is None else ids.tolist())
    return {"losses": losses, "traces": traces}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_folded_experts_match_the_reference(tmp_path: Path) -> None:
    expected, net = train_reference()
    assert len(set(expected)) == STEPS  # the steps do update the parameters
    out = run_ranks(4, train, str(tmp_path), workdir=tmp_path)
    results = out["losses"]
    for (kw, table), losses in zip(FP32, results[: len(FP32)], strict=True):
        assert losses == pytest.approx(expected, abs=TOLERANCE), (kw, table)
    for kw, losses in zip(BF16, results[len(FP32) :], strict=True):
        assert losses == pytest.approx(expected, abs=1e-3), kw
    trained = {n: p.detach() for n, p in net.named_parameters() if ".mlp.experts." in n or ".mlp.router." in n}
    for i, (kw, table) in enumerate(FP32):
        everyone = torch.load(tmp_path / f"held{i}.pt")
        pp = kw.get("pipeline_parallel_degree", 1)
        # every parameter held somewhere; each of the 4 ranks holds its stage's 4 / pp routers
        assert set().union(*everyone) == trained.keys(), kw
        assert sum(".router." in n for held in everyone for n in held) == 4 * MOE.num_hidden_layers // pp, kw
        for rank, held in enumerate(everyone):
            for name, p in held.items():
                assert p.shape == trained[name].shape, (kw, rank, name)  # whole experts
                error = float((p - trained[name]).abs().max())
                assert error <= WEIGHT_TOLERANCE, (kw, table, rank, name, error)
    routed = reference_routing(0)
    assert routed.shape == (BATCH * SEQ, MOE.num_hidden_layers, MOE.num_experts_per_tok)
    for kw, trace in zip(TRACED, out["traces"], strict=True):
        assert np.array_equal(np.array(trace), routed), kw
