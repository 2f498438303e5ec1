"""Routing traces: which experts each token of a run was routed to, for the expert-placement search.

The file is a NumPy ``.npz`` with ``expert_ids``, an int array (tokens, MoE layers, k) with the
layers in model order; ``num_experts``, a scalar; and ``model``, the model's name. Tokens are
ordered by data-parallel replica, then by step, then as the replica's micro-batches go (each
micro-batch's rows and positions in order): every layer lists the same tokens in the same order.

Each MoE layer records the expert ids of its forwards (``runtime.model.MoE.routing_trace``);
the ranks of the first tensor-parallel shard (the others route the same tokens) send theirs to
rank 0, which joins the replicas and the pipeline stages. With the experts folded
(``Layout.folds_experts``) each tensor-parallel rank routes its own slice of every micro-batch's
sequence: every rank sends its records, and rank 0 joins each forward's slices along the sequence.
"""

from pathlib import Path

import numpy as np
import torch.distributed as dist

from planner.schemas import ModelSpec
from planner.schemas.geometry import MeshAxis
from runtime.mlp import MoE, moe_layers
from runtime.trainer import Trainer


def record_routing(trainer: Trainer) -> None:
    """Make every MoE layer of ``trainer``'s chunks record its routing from now on."""
    for chunk in trainer.chunks:
        for module in chunk.modules():
            if isinstance(module, MoE):
                module.routing_trace = []


def gather_routing(trainer: Trainer, tokens_per_replica: int) -> np.ndarray | None:
    """Every rank calls it after training; on rank 0 the (tokens, MoE layers, k) expert ids the
    job recorded, None on the other ranks.

    Args:
        trainer: this rank's trainer, recording since before its first step.
        tokens_per_replica: tokens each data-parallel replica trained on (steps x rows x
            sequence length). A pipeline stage's first step forwards one micro-batch of
            placeholders first (torch.distributed.pipelining infers its shapes so); a layer's
            records beyond this count are those, and are dropped.
    """
    tp = trainer.mesh[MeshAxis.TP]
    routers = tp.size() if trainer.layout.folds_experts else 1  # tensor-parallel ranks routing their own tokens
    mine: dict[int, list[np.ndarray]] = {}
    if tp.get_local_rank() < routers:
        for chunk in trainer.chunks:
            for name, block in chunk.layers.items():
                if isinstance(block.mlp, MoE) and block.mlp.routing_trace:
                    mine[int(name)] = [ids.numpy() for ids in block.mlp.routing_trace]
    sent = (trainer.dp_rank, tp.get_local_rank(), mine)
    everyone: list[tuple[int, int, dict[int, list[np.ndarray]]]] | None = (
        [sent] * dist.get_world_size() if dist.get_rank() == 0 else None
    )
    dist.gather_object(sent, everyone, dst=0)
    if everyone is None:
        return None
    per_layer: dict[int, dict[int, dict[int, list[np.ndarray]]]] = {}  # layer -> replica -> shard -> forwards
    for replica, shard, layers in everyone:
        for layer, forwards in layers.items():
            per_layer.setdefault(layer, {}).setdefault(replica, {})[shard] = forwards
    rows = trainer.layout.micro_batch_size
    columns = [
        np.concatenate(
            [_replica_ids(shards, rows, tokens_per_replica) for _, shards in sorted(per_layer[layer].items())]
        )
        for layer in moe_layers(trainer.model)
    ]
    return np.stack(columns, axis=1)


def _replica_ids(shards: dict[int, list[np.ndarray]], rows: int, tokens: int) -> np.ndarray:
    """One replica's expert ids in one layer: each forward's slices (by tensor-parallel rank)
    joined, the forwards in order, the last ``tokens`` of them kept."""
    forwards = [f for _, f in sorted(shards.items())]
    return np.concatenate([_join_slices(slices, rows) for slices in zip(*forwards, strict=True)])[-tokens:]


def _join_slices(slices: tuple[np.ndarray, ...], rows: int) -> np.ndarray:
    """One forward's expert ids (rows x s, k), token by token in row and position order, from the
    (rows x s/t, k) ids of its sequence slices in tensor-parallel rank order (one slice: as is)."""
    k = slices[0].shape[-1]
    return np.concatenate([ids.reshape(rows, -1, k) for ids in slices], axis=1).reshape(-1, k)


def save_routing_trace(path: Path, expert_ids: np.ndarray, model: ModelSpec) -> None:
    """Write ``expert_ids`` (tokens, MoE layers, k) of ``model`` as a routing-trace file."""
    with path.open("wb") as f:
        np.savez(
            f, expert_ids=expert_ids.astype(np.int64), num_experts=np.int64(model.num_local_experts), model=model.name
        )
