"""Where a rank's tensors sit in the reference model's whole tensors, for checkpoints
(``runtime.checkpoint``): DTensors say so themselves; the tensors the runtime cuts by hand are
given the same say here, as DTensors (experts split over the tensor-parallel group) or as
ShardedTensors (a vocabulary's uneven row blocks)."""

from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.distributed._shard.sharded_tensor.shard import Shard as TensorShard
from torch.distributed.tensor import DTensor, Shard

from planner.schemas.geometry import MeshAxis, vocabulary_rows
from runtime.trainer import Trainer

Splits = dict[int, Callable[[torch.Tensor], torch.Tensor]]
"""Parameters split by hand, by identity: what gives a tensor laid out as such a parameter's
local part its place in the whole (``expert_splits``, ``vocabulary_splits``)."""


def expert_splits(trainer: Trainer) -> Splits:
    """The experts' weights under tensor parallelism (not folded): plain tensors holding the
    rank's even share of the reference's, as ``runtime.tensor_parallel.split_expert`` cuts them
    (gate and up by rows, down by columns; down's bias whole on tensor rank 0)."""
    layout = trainer.layout
    if not trainer.model.is_moe or layout.tensor_parallel_degree == 1 or layout.folds_experts:
        return {}
    mesh = trainer.mesh[MeshAxis.TP]
    splits: Splits = {}
    for chunk in trainer.chunks:
        for name, p in chunk.named_parameters():
            if ".mlp.experts." in name and not name.endswith("down.bias"):
                placement = Shard(1) if name.endswith("down.weight") else Shard(0)
                splits[id(p)] = partial(DTensor.from_local, device_mesh=mesh, placements=(placement,), run_check=False)
    return splits


def vocabulary_splits(trainer: Trainer) -> Splits:
    """Under a vocabulary layout split over the pipeline, the shards' rows of the embedding and
    output matrices: blocks of rows as ``schemas.geometry.vocabulary_rows`` cuts them, the first
    V mod p one row longer, which a DTensor's even chunks cannot say; a ShardedTensor can."""
    if trainer.vocabulary is None:
        return {}
    layout, vocab_size = trainer.layout, trainer.model.vocab_size
    blocks = [vocabulary_rows(vocab_size, layout, stage) for stage in range(layout.pipeline_parallel_degree)]
    ranks = dist.get_process_group_ranks(trainer.mesh[MeshAxis.PP].get_group())
    cut = partial(row_block, blocks=blocks, ranks=ranks, stage=trainer.pp_rank)
    return {id(p): cut for p in trainer.vocabulary.shards.parameters()}


def row_block(rows: torch.Tensor, *, blocks: list[range], ranks: list[int], stage: int) -> torch.Tensor:
    """``rows`` (pipeline rank ``stage``'s block of ``blocks``) as that block of the whole
    matrix, held by global rank ``ranks[stage]`` (its data- and tensor-parallel peers hold
    the same blocks: DCP writes each once)."""
    width, device = rows.shape[1], str(rows.device)
    shards = [
        ShardMetadata(shard_offsets=[b.start, 0], shard_sizes=[len(b), width], placement=f"rank:{r}/{device}")
        for b, r in zip(blocks, ranks, strict=True)
    ]
    properties = TensorProperties(dtype=rows.dtype, requires_grad=False)
    whole = ShardedTensorMetadata(shards, torch.Size([blocks[-1].stop, width]), properties)
    mine = [TensorShard(rows, shards[stage])]
    out: torch.Tensor = ShardedTensor._init_from_local_shards_and_global_metadata(mine, whole)
    return out


def placed(tensor: torch.Tensor, param: torch.Tensor, splits: Splits) -> torch.Tensor:
    """``tensor`` (laid out as ``param``'s local part) as a DTensor where ``param`` is split by
    hand, so that DCP records where its part sits; as it is otherwise."""
    split = splits.get(id(param))
    if split is None or isinstance(tensor, DTensor) or tensor.shape != param.shape:
        return tensor
    return split(tensor)


def shaped(flat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``flat`` (a parameter's local elements, flattened) in the shape and placement of ``like``."""
    if isinstance(like, DTensor):
        view = flat.view(like.to_local().shape)
        return DTensor.from_local(
            view, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
        )
    return flat.view(like.shape)
