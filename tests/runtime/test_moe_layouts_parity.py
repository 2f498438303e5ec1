"""tiny-moe's layouts on 4 ranks train like the single-process reference (SGD, float32 on CPU;
losses within the dense parity tests' 1e-5, 1e-3 in bf16 mixed precision), each test's cases in
one 4-rank launch (a launch for all three ran no faster: its later cases slowed down):

- expert parallelism: ep 2 and 4, ZeRO-1/2/3, a plan's and per-layer non-contiguous placements,
  replicated experts, tp x dp x ep and pp x dp x ep, the MoE block recomputed (selective ``moe``);
  the routing trace of a step and the all-to-all traffic it measures, against the reference's routing.
- folded experts (expert tensor parallelism 1 under tp2 with sequence parallelism, Megatron-Core's
  MoE parallel folding): each rank routes its own quarter (tp2 x dp2) of the batch's tokens and
  exchanges them over an expert-parallel group of consecutive stage ranks (ep 2 and 4, so a group
  mixes tensor shards and replicas); the experts stay whole, and after training every expert and
  router a rank holds equals the reference's, which checks the experts' gradient divisor (d, not
  the edp group's d t / ep) and the routers' sum over the tensor-parallel ranks.
- experts split over the tensor-parallel group (expert-tensor parallelism equal to tp,
  ``runtime.tensor_parallel``) under tp2 x dp2: each tensor-parallel rank holds half of every
  expert's matrices, and the halves of the trained experts (and the routers, whose gradients are
  partial per rank) equal the reference's.

The fp32 layouts train ``WEIGHED_STEPS`` steps, and every expert and router (or tensor-parallel
part of one) each rank holds after them is compared with the reference's: the weights check the
last step's update, which a loss never sees; bf16 layouts train 3 steps (their losses only)."""

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
    PLACED,
    REPLICATED,
    SEQ,
    SHUFFLED,
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

from planner.schemas import DeviceMap, DType
from planner.schemas.geometry import MeshAxis
from runtime.expert_parallel import PlacementTable
from runtime.mlp import MoE
from runtime.routing_trace import gather_routing, record_routing
from runtime.trainer import Trainer

WEIGHT_TOLERANCE = 1e-6
WEIGHED_STEPS = 2
"""Steps of the fp32 layouts whose experts and routers are compared with the reference's: the
first loss checks the forward, the second the first update, the weights the second update."""

UNEVEN: PlacementTable = (((0, 1, 2), (3,)), ((1,), (0, 2, 3)), ((3, 2), (1, 0)), ((2, 0, 3), (1,)))
"""Ranks hosting different numbers of experts in some layers."""

PERMUTED: PlacementTable = (
    ((2,), (0,), (3,), (1,)),
    ((1,), (3,), (0,), (2,)),
    ((3,), (2,), (1,), (0,)),
    ((0,), (1,), (2,), (3,)),
)
"""ep 4: one expert a rank, a different permutation in each layer."""

# --- expert parallelism (tp 1 unless given; experts split over tp when it is 2)

LAYOUTS: list[tuple[dict[str, Any], PlacementTable | None]] = [
    (dict(data_parallel_degree=4, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=4, micro_batch_size=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=1, expert_placement=PLACED), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=4, expert_parallel_degree=2), UNEVEN),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=1), REPLICATED),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, zero_stage=3), REPLICATED),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=3), None),
    # a DeviceMap listing the ep and edp axes' devices out of order (ordered groups, runtime.mesh)
    (dict(data_parallel_degree=4, expert_parallel_degree=2, device_map=DeviceMap(devices=(3, 1, 0, 2))), None),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, sequence_parallel=True), None),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, zero_stage=2), None),
    (dict(data_parallel_degree=2, pipeline_parallel_degree=2, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=2, pipeline_parallel_degree=2, zero_stage=1), None),
    # the MoE block checkpointed: its dispatch and combine all-to-alls run again in the backward
    (dict(data_parallel_degree=4, expert_parallel_degree=2, recompute="selective", recompute_modules=["moe"]), None),
]
"""Layouts trained in fp32 (``WEIGHED_STEPS``), with their placement tables (None: the layout's)."""

MIXED = [
    dict(data_parallel_degree=4, expert_parallel_degree=2),
    dict(data_parallel_degree=4, expert_parallel_degree=4, zero_stage=1),
]
"""Layouts trained in bf16 mixed precision (within bf16 rounding, 1e-3, as the dense test)."""

TRACED = [12, dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, recompute="full")]
"""Layouts whose first step's routing trace is compared with the reference's routing (an int:
the layout of ``LAYOUTS`` at that index, traced over its first step of training)."""

MEASURED = 3
"""The index in ``LAYOUTS`` of the layout whose first step's all-to-all traffic is compared with
the reference's routing (SHUFFLED: a placement table given to the trainer)."""

# --- folded experts: tp2 with sequence parallelism, experts whole on every rank

FOLDED = {"tensor_parallel_degree": 2, "sequence_parallel": True, "expert_tensor_parallel_degree": 1}

FOLDED_FP32: list[tuple[dict[str, Any], PlacementTable | None]] = [
    (dict(data_parallel_degree=2, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=2, expert_parallel_degree=4), PERMUTED),
    (dict(data_parallel_degree=2, expert_parallel_degree=2, zero_stage=1), REPLICATED),
    (dict(data_parallel_degree=2, expert_parallel_degree=1), None),  # every expert on every rank
    (dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=2, expert_parallel_degree=4, zero_stage=3, recompute="full"), None),
]
"""Folded tp2 layouts trained in fp32 (``WEIGHED_STEPS``), with their placement tables."""

FOLDED_TRACED: list[dict[str, Any]] = [
    dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=4, micro_batch_size=2),
]
"""Folded layouts whose first step's routing trace (each rank's slice of the sequence, joined) is
compared with the reference's routing; the pipeline's also records shape inference's placeholders."""

FOLDED_BF16: list[dict[str, Any]] = [dict(data_parallel_degree=2, expert_parallel_degree=4)]
"""Folded tp2 layouts trained in bf16 mixed precision."""

# --- experts split over tp2

SPLIT_FP32 = [
    dict(data_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, sequence_parallel=True),
    dict(data_parallel_degree=1, pipeline_parallel_degree=2),
    dict(data_parallel_degree=2, expert_parallel_degree=2, zero_stage=3),
    dict(data_parallel_degree=2, zero_stage=3, recompute="full"),
    dict(data_parallel_degree=1, pipeline_parallel_degree=2, expert_parallel_degree=1, sequence_parallel=True),
    # the MoE block checkpointed under sequence parallelism (its experts keep their gathered input)
    dict(data_parallel_degree=2, sequence_parallel=True, recompute="selective", recompute_modules=["core_attn", "moe"]),
]
"""tp2 layouts trained in fp32 (``WEIGHED_STEPS``; every one on 4 ranks: dp x pp x 2)."""

SPLIT_BF16 = [
    dict(data_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, zero_stage=3, sequence_parallel=True),
]
"""tp2 layouts trained in bf16 mixed precision."""


def _routed_experts(name: str) -> bool:
    return ".mlp.experts." in name or ".mlp.router." in name


def _first_step_trace(trainer: Trainer, replicas: int) -> list[Any] | None:
    """Train ``trainer`` one step recording its routing; rank 0's trace of it (then no more records)."""
    record_routing(trainer)
    trainer.step(*batch(0))
    ids = gather_routing(trainer, BATCH // replicas * SEQ)
    for chunk in trainer.chunks:
        for module in chunk.modules():
            if isinstance(module, MoE):
                module.routing_trace = None
    return None if ids is None else ids.tolist()


def _traffic(trainer: Trainer) -> list[dict[int, list[int]]]:
    """Pairs each data-parallel replica sent to each expert-parallel rank so far, by layer."""
    sent = {int(i): block.mlp.dispatch.sent_pairs for i, block in trainer.chunks[0].layers.items()}
    everyone: list[tuple[int, dict[int, list[int]]]] = [(0, {})] * dist.get_world_size()
    dist.all_gather_object(everyone, (trainer.dp_rank, sent))
    return [layers for _, layers in sorted(everyone)]


def _held(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The experts and routers this rank holds, whole over the data-parallel group (a parameter
    sharded by ZeRO-3 gathered; under split experts, this tensor-parallel rank's part)."""
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().clone()
        for chunk in trainer.chunks
        for name, p in chunk.named_parameters()
        if _routed_experts(name)
    }


def _save_held(trainer: Trainer, path: Path) -> None:
    """Rank 0 saves what every rank holds of the experts and routers, with its tensor-parallel rank."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (trainer.mesh[MeshAxis.TP].get_local_rank(), _held(trainer)))
    if dist.get_rank() == 0:
        torch.save(everyone, path)


def train_expert_parallel(out: str) -> dict[str, Any]:
    """Each layout's losses, fp32 then bf16 (runs on every rank); the traces of ``TRACED``, the
    traffic of ``MEASURED``; rank 0 saves what every rank holds of the experts and routers after
    each fp32 layout trained. The first step of a traced (or measured) layout is its first loss too."""
    losses, traces, traffic = [], [], []
    for i, (kw, table) in enumerate(LAYOUTS):
        trainer = moe_trainer(layout_of(kw), table)
        trace = None
        if i in TRACED:
            record_routing(trainer)
        first = trainer.step(*batch(0))
        if i in TRACED:
            trace = gather_routing(trainer, BATCH // kw["data_parallel_degree"] * SEQ)
            traces.append((TRACED.index(i), None if trace is None else trace.tolist()))
        if i == MEASURED:
            traffic = _traffic(trainer)
        losses.append([first] + [trainer.step(*batch(s)) for s in range(1, WEIGHED_STEPS)])
        _save_held(trainer, Path(out) / f"expert_parallel{i}.pt")
    for kw in MIXED:
        losses.append(train_losses(moe_trainer(layout_of(kw), dtype=DType.BF16)))
    for j, kw in enumerate(TRACED):
        if isinstance(kw, dict):
            traces.append((j, _first_step_trace(moe_trainer(layout_of(kw)), kw["data_parallel_degree"])))
    return {"losses": losses, "traces": [t for _, t in sorted(traces)], "traffic": traffic}


def train_folded(out: str) -> dict[str, Any]:
    """Each folded layout's losses, fp32 then bf16, and the traces of ``FOLDED_TRACED``; rank 0
    saves what every rank holds of the experts and routers after each fp32 layout trained."""
    losses = []
    for i, (kw, table) in enumerate(FOLDED_FP32):
        trainer = moe_trainer(layout_of({**FOLDED, **kw}), table)
        losses.append(train_losses(trainer, WEIGHED_STEPS))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, _held(trainer))
        if dist.get_rank() == 0:
            torch.save(everyone, Path(out) / f"folded{i}.pt")
    for kw in FOLDED_BF16:
        losses.append(train_losses(moe_trainer(layout_of({**FOLDED, **kw}), dtype=DType.BF16)))
    traces = [
        (j, _first_step_trace(moe_trainer(layout_of({**FOLDED, **kw})), kw["data_parallel_degree"]))
        for j, kw in enumerate(FOLDED_TRACED)
    ]
    return {"losses": losses, "traces": [t for _, t in traces]}


def train_split(out: str) -> list[list[float]]:
    """Each split layout's losses, fp32 then bf16; rank 0 saves, per fp32 layout, each rank's
    tensor-parallel and data-parallel rank and the experts and routers it holds."""
    losses = []
    for i, kw in enumerate(SPLIT_FP32):
        trainer = moe_trainer(layout_of(kw, tensor_parallel_degree=2))
        losses.append(train_losses(trainer, WEIGHED_STEPS))
        mine = (trainer.mesh[MeshAxis.TP].get_local_rank(), trainer.dp_rank, _held(trainer))
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            torch.save(everyone, Path(out) / f"split{i}.pt")
    for kw in SPLIT_BF16:
        losses.append(train_losses(moe_trainer(layout_of(kw, tensor_parallel_degree=2), dtype=DType.BF16)))
    return losses


def _check_losses(cases: list[Any], results: list[list[float]], tolerance: float, steps: int = STEPS) -> None:
    reference = train_reference()[0][:steps]
    assert len(set(reference)) == steps  # the steps do update the parameters
    for case, losses in zip(cases, results, strict=True):
        assert losses == pytest.approx(reference, abs=tolerance), case


def _check_traces(cases: list[Any], traces: list[Any]) -> None:
    """Every layer's top-k of every token of the first step, as the reference routes them."""
    routed = reference_routing(0)
    assert routed.shape == (BATCH * SEQ, MOE.num_hidden_layers, MOE.num_experts_per_tok)
    for case, trace in zip(cases, traces, strict=True):
        assert np.array_equal(np.array(trace), routed), case


def _trained_experts() -> dict[str, torch.Tensor]:
    """The reference's experts and routers after ``WEIGHED_STEPS`` steps."""
    net = train_reference(WEIGHED_STEPS)[1]
    return {n: p.detach() for n, p in net.named_parameters() if _routed_experts(n)}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_expert_parallel_layouts_match_the_reference(tmp_path: Path) -> None:
    out = run_ranks(4, train_expert_parallel, str(tmp_path), workdir=tmp_path)
    results, saved = out["losses"], tmp_path
    _check_losses(LAYOUTS, results[: len(LAYOUTS)], TOLERANCE, WEIGHED_STEPS)
    trained = _trained_experts()
    for i, (kw, table) in enumerate(LAYOUTS):
        everyone = torch.load(saved / f"expert_parallel{i}.pt")
        assert set().union(*(held for _, held in everyone)) == trained.keys(), (kw, table)  # all held somewhere
        tp = kw.get("tensor_parallel_degree", 1)
        for rank, (tp_rank, held) in enumerate(everyone):
            for name, p in held.items():
                # under tp its gate/up rows or down columns of each expert, the router whole
                expected = trained[name]
                if ".mlp.experts." in name:
                    expected = expected.chunk(tp, dim=1 if ".down." in name else 0)[tp_rank]
                assert p.shape == expected.shape, (kw, table, rank, name)
                error = float((p - expected).abs().max())
                assert error <= WEIGHT_TOLERANCE, (kw, table, rank, name, error)
    _check_losses(MIXED, results[len(LAYOUTS) :], 1e-3)
    _check_traces([LAYOUTS[kw] if isinstance(kw, int) else kw for kw in TRACED], out["traces"])
    # the traffic: each replica's pairs (its rows' tokens x k) to the rank hosting each expert
    routed = reference_routing(0)
    kw, table = LAYOUTS[MEASURED]
    assert table is not None
    rows = BATCH // kw["data_parallel_degree"] * SEQ
    assert len(out["traffic"]) == kw["data_parallel_degree"]
    for replica, measured in enumerate(out["traffic"]):
        mine = routed[replica * rows : (replica + 1) * rows]
        for layer, hosts in enumerate(table):
            expected = [int(np.isin(mine[:, layer], hosted).sum()) for hosted in hosts]
            assert measured[str(layer)] == expected, (replica, layer)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_folded_experts_match_the_reference(tmp_path: Path) -> None:
    out, saved = run_ranks(4, train_folded, str(tmp_path), workdir=tmp_path), tmp_path
    results = out["losses"]
    _check_losses(FOLDED_FP32, results[: len(FOLDED_FP32)], TOLERANCE, WEIGHED_STEPS)
    _check_losses(FOLDED_BF16, results[len(FOLDED_FP32) :], 1e-3)
    trained = _trained_experts()
    for i, (kw, table) in enumerate(FOLDED_FP32):
        everyone = torch.load(saved / f"folded{i}.pt")
        pp = kw.get("pipeline_parallel_degree", 1)
        # every parameter held somewhere; each of the 4 ranks holds its stage's 4 / pp routers
        assert set().union(*everyone) == trained.keys(), kw
        assert sum(".router." in n for held in everyone for n in held) == 4 * MOE.num_hidden_layers // pp, kw
        for rank, held in enumerate(everyone):
            for name, p in held.items():
                assert p.shape == trained[name].shape, (kw, rank, name)  # whole experts
                error = float((p - trained[name]).abs().max())
                assert error <= WEIGHT_TOLERANCE, (kw, table, rank, name, error)
    _check_traces(FOLDED_TRACED, out["traces"])


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


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_experts_split_over_tensor_parallel_ranks_match_the_reference(tmp_path: Path) -> None:
    results, saved = run_ranks(4, train_split, str(tmp_path), workdir=tmp_path), tmp_path
    _check_losses(SPLIT_FP32, results[: len(SPLIT_FP32)], TOLERANCE, WEIGHED_STEPS)
    _check_losses(SPLIT_BF16, results[len(SPLIT_FP32) :], 1e-3)
    trained = _trained_experts()
    f, h = MOE.intermediate_size, MOE.hidden_size
    for i, kw in enumerate(SPLIT_FP32):
        everyone = torch.load(saved / f"split{i}.pt")
        for _, _, held in everyone:  # each rank: half of each expert it holds, gate/up rows and down columns
            for name, p in held.items():
                if ".mlp.experts." in name:
                    assert tuple(p.shape) == ((h, f // 2) if ".down." in name else (f // 2, h)), (kw, name)
        whole = _reassemble(everyone)
        assert whole.keys() == trained.keys(), kw
        for name, p in trained.items():
            error = float((whole[name] - p).abs().max())
            assert error <= WEIGHT_TOLERANCE, (kw, name, error)
