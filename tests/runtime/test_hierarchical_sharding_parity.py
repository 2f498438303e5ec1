"""ZeRO in sharding groups (HSDP, ``Layout.sharding_group_size``) and ZeRO-3's secondary
partition (hpZ, ``Layout.secondary_partition_size``) train like the single-process reference:
the losses of the first steps match within 1e-5 (SGD, float32 on CPU), and each rank keeps its
weights sharded over the ranks the layout says, between steps and between forward and backward.

One launch of 4 ranks checks every layout, amortizing process start-up (as test_parity does)."""

from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from planner.files.models import load_model
from planner.schemas import DeviceMap, Layout, ZeroStage
from planner.schemas.geometry import ShardingMeshAxis
from runtime.data import synthetic_batch
from runtime.optim import DataParallelOptimizer
from runtime.reference import reference_losses
from runtime.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

TOLERANCE = 1e-5
BATCH, SEQ, STEPS, SEED, LR = 8, 32, 3, 0, 0.1
GPT = load_model("tiny-gpt")
ZERO1, ZERO2, ZERO3 = ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS


def L(d: int, t: int, p: int, b: int, **kw: Any) -> dict[str, Any]:
    return dict(data_parallel_degree=d, tensor_parallel_degree=t, pipeline_parallel_degree=p, micro_batch_size=b, **kw)


# (layout, ranks a layer's weights are sharded over between steps, and after its forward)
LAYOUTS: list[tuple[dict[str, Any], int, int]] = [
    (L(4, 1, 1, 1, zero_stage=ZERO3, sharding_group_size=2), 2, 2),  # HSDP, 2 micro-batches
    (L(4, 1, 1, 1, zero_stage=ZERO2, sharding_group_size=2), 2, 1),  # whole until the last backward
    (L(4, 1, 1, 2, zero_stage=ZERO3, secondary_partition_size=2), 4, 2),  # hpZ
    (L(4, 1, 1, 1, zero_stage=ZERO3, secondary_partition_size=2, device_map=DeviceMap(devices=(1, 0, 3, 2))), 4, 2),
    (L(4, 1, 1, 1, zero_stage=ZERO3, sharding_group_size=2, secondary_partition_size=1), 2, 1),
    (L(4, 1, 1, 1, zero_stage=ZERO1, sharding_group_size=2), 2, 1),  # ZeRO-1: the optimizer state over 2
    (L(2, 2, 1, 1, zero_stage=ZERO3, sharding_group_size=1), 1, 1),  # tensor parallel, replicas only
    (L(2, 1, 2, 1, zero_stage=ZERO2, sharding_group_size=1), 1, 1),  # a pipeline
]


def shard_ranks(module: nn.Module) -> int:
    """Ranks FSDP shards ``module``'s first weight over now (1 if it holds it whole): the size of
    the last mesh dimension that shards it other than the tensor-parallel one."""
    weight = next(module.parameters())
    if not isinstance(weight, DTensor):
        return 1
    mesh = weight.device_mesh
    names = mesh.mesh_dim_names or ("",) * mesh.ndim
    sharded = [mesh.size(i) for i, p in enumerate(weight.placements) if isinstance(p, Shard) and names[i] != "tp"]
    return sharded[-1] if sharded else 1


def shared_over(trainer: Trainer, layer: nn.Module) -> int:
    """Ranks sharing ``layer``'s states out between steps: its weights' FSDP shard, or under
    ZeRO-0/1 its optimizer state's (1: each rank holds all of it)."""
    optimizer = trainer.optimizer
    if isinstance(optimizer, DataParallelOptimizer):
        return optimizer.shards if optimizer.shard else 1
    return shard_ranks(layer)


def train(layouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``train_one`` of each layout (runs on every rank; rank 0's answer)."""
    return [train_one(Layout(**kw)) for kw in layouts]


def train_one(layout: Layout) -> dict[str, Any]:
    """The layout's losses for STEPS steps, how its first layer's states are shared out between
    steps and its weights after its forward, and in sharding groups the all-reduces over the
    replicas a step and over the whole data-parallel group, and the chunk's FSDP units."""
    trainer = Trainer(
        GPT, layout, global_batch_size=BATCH, seed=SEED, optimizer="sgd", lr=LR, device=torch.device("cpu")
    )
    chunk = trainer.chunks[0]
    layer = next(iter(chunk.layers.values()))
    after_forward: list[int] = []  # read once the chunk's forward is done (FSDP resharded the layer)
    hook = chunk.register_forward_hook(lambda *_: after_forward.append(shard_ranks(layer)))
    replicas = None
    if layout.sharding_group_size is not None and trainer.data_parallel.shards_with_fsdp:
        replicas = trainer.data_parallel.meshes.shard[ShardingMeshAxis.REPLICATE].get_group()
    elif isinstance(trainer.optimizer, DataParallelOptimizer) and trainer.optimizer.replica_group is not None:
        replicas = trainer.optimizer.replica_group
    data_group = trainer.data_parallel.mesh.get_group()
    calls: list[dist.ProcessGroup | None] = []
    all_reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("group"))
        return all_reduce(*args, **kwargs)

    losses = []
    with mock.patch.object(dist, "all_reduce", counted):
        for step in range(STEPS):
            inputs, targets = synthetic_batch(GPT.vocab_size, BATCH, SEQ, step=step, seed=SEED)
            losses.append(trainer.step(inputs, targets))
    hook.remove()
    # FSDP units holding parameters: a unit of several modules (the embeddings) is one state over
    # all of them; a pipeline stage's root may hold none
    states = {id(s): s for m in chunk.modules() if isinstance(m, FSDPModule) for s in [m._get_fsdp_state()]}
    return {
        "losses": losses,
        "between_steps": shared_over(trainer, layer),
        "after_forward": after_forward,
        "replica_all_reduces_per_step": sum(g is replicas for g in calls) / STEPS if replicas is not None else None,
        "data_group_all_reduces_per_step": sum(g is data_group for g in calls) / STEPS,
        "units": sum(s._fsdp_param_group is not None for s in states.values()),
    }


def check(world: int, layouts: list[tuple[dict[str, Any], int, int]], tmp_path: Path) -> None:
    reference = reference_losses(
        GPT, global_batch_size=BATCH, seq_len=SEQ, steps=STEPS, seed=SEED, optimizer="sgd", lr=LR
    )
    assert len(set(reference)) == STEPS  # the steps do update the parameters
    results = run_ranks(world, train, [kw for kw, _, _ in layouts], workdir=tmp_path)
    for (kw, between, after), result in zip(layouts, results, strict=True):
        assert result["losses"] == pytest.approx(reference, abs=TOLERANCE), kw
        assert result["between_steps"] == between, kw
        assert set(result["after_forward"]) == {after}, kw
        if result["replica_all_reduces_per_step"] is not None:  # once a step, whatever the micro-batches
            # FSDP: one per unit; ZeRO-1's gradient buckets: tiny-gpt's fill one; beside FSDP, the
            # ZeRO-1 optimizer of vocabulary shards split over the pipeline one more. None over the
            # whole data-parallel group: only a share of the bytes crosses between the groups.
            vocabulary_shards = 1 if result["units"] and kw.get("vocabulary_layout") is not None else 0
            assert result["replica_all_reduces_per_step"] == (result["units"] or 1) + vocabulary_shards, kw
            assert result["data_group_all_reduces_per_step"] == 0, kw


def test_hierarchical_sharding_trains_as_the_reference(tmp_path: Path) -> None:
    check(4, LAYOUTS, tmp_path)


@pytest.mark.slow
def test_eight_ranks_with_tensor_parallel_and_pipelines(tmp_path: Path) -> None:
    """Sharding groups of more than one rank beside tensor parallelism (FSDP joins the tensor
    axis of the layout's mesh with the sharding mesh), and beside a pipeline with the vocabulary
    split over it (its shards' own ZeRO-1 optimizer within the group); a secondary partition
    within sharding groups. (11 s on 2 cores.)"""
    layouts = [
        (L(4, 2, 1, 1, zero_stage=ZERO3, sharding_group_size=2), 2, 2),
        (L(4, 1, 2, 1, zero_stage=ZERO2, sharding_group_size=2, vocabulary_layout="vocab-1"), 2, 1),
        (L(8, 1, 1, 1, zero_stage=ZERO3, sharding_group_size=4, secondary_partition_size=2), 4, 2),
    ]
    check(8, layouts, tmp_path)
