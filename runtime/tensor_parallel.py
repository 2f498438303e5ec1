"""Tensor and sequence parallelism of a model chunk (Megatron-LM's split, through DTensor).

q/k/v and gate/up are split column-wise, o and down row-wise; the embedding is split by
vocabulary, the output layer column-wise with a vocabulary-parallel loss (torch's
``loss_parallel``). With sequence parallelism the norms and the residual stream hold 1/t of the
sequence, gathered before attention and the MLP and reduce-scattered after them (Korthikanti et
al. 2022, sec. 4.2.2); a chunk whose embedding and output layer are split over the pipeline
instead (``runtime.vocabulary_parallel``) splits its embedded tokens and returns its shard. A
mixture-of-experts MLP is not split: each tensor-parallel rank holds its router and experts
whole and routes the same tokens (expert-tensor parallelism of 1, as Megatron-LM's default), so
their gradients agree across the group without a reduction; under sequence parallelism it routes
the gathered sequence and keeps its rank's share of the output.
"""

from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from runtime.model import MLP, Decoder, MoE


def tensor_parallel(chunk: Decoder, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Split ``chunk``'s parameters over ``tp_mesh`` in place (see the module's docstring).

    Args:
        chunk: a model chunk; whichever of embedding, layers and output layer it holds is split.
        tp_mesh: the 1-D mesh of this rank's tensor-parallel group.
        sequence_parallel: also split the norms' and the residual stream's sequence.
    """
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    for i, block in chunk.layers.items():
        plan |= {f"layers.{i}.attn.{n}": ColwiseParallel() for n in ("q", "k", "v")}
        plan[f"layers.{i}.attn.o"] = RowwiseParallel(output_layouts=seq)
        if isinstance(block.mlp, MLP):
            plan |= {
                f"layers.{i}.mlp.{n}": ColwiseParallel() for n in ("gate", "up") if getattr(block.mlp, n) is not None
            }
            plan[f"layers.{i}.mlp.down"] = RowwiseParallel(output_layouts=seq)
        if sequence_parallel:
            plan |= {f"layers.{i}.{n}": SequenceParallel() for n in ("norm1", "norm2")}
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan |= {f"layers.{i}.attn": gather, f"layers.{i}.mlp": gather}
            if isinstance(block.mlp, MoE):  # whole on every rank: takes the gathered sequence, keeps its share
                plan[f"layers.{i}.mlp"] = PrepareModuleInputOutput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_input=True,
                    output_layouts=(Replicate(),),
                    desired_output_layouts=(Shard(1),),
                )
    if chunk.tok_emb is not None:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
    if chunk.takes_tokens and sequence_parallel:
        chunk.to_sequence_shards = partial(_scatter_sequence, mesh=tp_mesh)
    if chunk.norm is not None and sequence_parallel:
        # without the output layer (split over the pipeline), the chunk returns its sequence shard
        plan["norm"] = SequenceParallel(use_local_output=chunk.head is None)
    if chunk.head is not None:
        plan["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    tied = chunk.tok_emb is not None and chunk.head is not None and chunk.head.weight is chunk.tok_emb.weight
    parallelize_module(chunk, tp_mesh, plan)  # type: ignore[arg-type]
    if tied:  # parallelizing each module replaced the shared parameter by two DTensors
        assert chunk.head is not None and chunk.tok_emb is not None
        chunk.head.weight = chunk.tok_emb.weight


def loss_context(tensor_parallel_degree: int) -> AbstractContextManager[None]:
    """Where the loss and its backward run: the vocabulary-parallel loss when the output layer is
    split (tensor_parallel_degree > 1), else nothing."""
    return loss_parallel() if tensor_parallel_degree > 1 else nullcontext()


def _scatter_sequence(h: torch.Tensor, *, mesh: DeviceMesh) -> torch.Tensor:
    """A replicated (b, s, h) activation to this rank's slice of the sequence; the backward
    all-gathers the gradient, so replicated parameters before it (positions) get it whole."""
    return DTensor.from_local(h, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local()
