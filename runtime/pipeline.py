"""Pipeline parallelism: this rank's model chunks, their schedule, and the tied embedding.

Each rank builds its chunks (``schemas.geometry.stage_chunks``) from the full reference model,
keeping the layers of the plan's split, so parameters match the reference exactly; the
vocabulary layers go where ``schemas.geometry`` places them. torch.distributed.pipelining runs
GPipe, 1F1B or interleaved 1F1B. A tied output layer on another stage than the embedding is a
copy whose gradient is summed with the embedding's after each backward (as Megatron-LM does).
Under a vocabulary layout split over the pipeline the chunks hold neither matrix: the first
embeds tokens and the last computes its loss through ``runtime.vocabulary_parallel``.
"""

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.distributed.tensor import DTensor

from planner.schemas import Layout, ModelSpec, Schedule
from planner.schemas.geometry import (
    chunk_layer_range,
    chunk_stage,
    embedding_chunk,
    output_chunk,
    rank_of,
    stage_chunks,
    tied_copy_stages,
)
from runtime.model import Decoder, loss_fn
from runtime.optim import local

PipelineSchedule = ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B


def build_chunks(
    model: ModelSpec, layout: Layout, stage: int, *, seed: int, experts: Mapping[int, Sequence[int]] | None = None
) -> list[Decoder]:
    """Pipeline rank ``stage``'s model chunks: each its layers, with the embedding and the output
    layer where the layout places them (every parameter seeded by its name, as the reference);
    ``experts``: the experts each MoE layer holds here (default all)."""
    return [
        Decoder(
            model,
            seed=seed,
            layers=chunk_layer_range(model, layout, c),
            embedding=c == embedding_chunk(layout),
            output=c == output_chunk(layout),
            vocabulary=not layout.vocabulary_layout.over_pipeline,
            experts=experts,
        )
        for c in stage_chunks(layout, stage)
    ]


StageActivations = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
"""A chunk's example input and output (meta tensors), PipelineStage's input_args and output_args."""


def build_schedule(
    chunks: Sequence[Decoder],
    layout: Layout,
    stage: int,
    device: torch.device,
    pp_mesh: DeviceMesh,
    micro_batches: int,
    *,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
    activations: StageActivations | None = None,
    step_micro_batches: int | None = None,
) -> PipelineSchedule:
    """The layout's schedule over this rank's ``chunks`` on the pipeline group ``pp_mesh``;
    ``loss``: the last stage's loss function; ``activations``: the stages' inputs and outputs
    given up front, so that the schedule runs no forward and backward of its own to infer them
    (the vocabulary-parallel passes would take part in those, and the other ranks would not);
    ``step_micro_batches``: when a step runs several schedules (``TrainingSpec.pipeline_flushes``),
    all of their micro-batches: each loss is then divided by that count and the gradients left
    unscaled, so that they accumulate over the schedules to the step's mean (torch's own scaling
    divides the whole gradient by one schedule's count at each schedule's end)."""
    n = layout.num_chunks
    stages: list[_PipelineStageBase] = []
    for chunk, c in zip(chunks, stage_chunks(layout, stage), strict=True):
        inputs, outputs = activations(c) if activations else (None, None)
        stages.append(PipelineStage(chunk, c, n, device, inputs, outputs, group=pp_mesh.get_group()))
    scale = step_micro_batches is None  # torch's own scaling, by this schedule's micro-batches
    if step_micro_batches is not None:
        loss = _divided(loss, step_micro_batches)
    if layout.schedule is Schedule.INTERLEAVED:
        return ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=loss, scale_grads=scale)
    cls = ScheduleGPipe if layout.schedule is Schedule.GPIPE else Schedule1F1B
    return cls(stages[0], n_microbatches=micro_batches, loss_fn=loss, scale_grads=scale)


def _divided(
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], count: int
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss`` over ``count``: one micro-batch's share of a step's mean."""

    def divided(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss(output, target) / count

    return divided


def stage_activations(
    layout: Layout, model: ModelSpec, micro_batch_size: int, seq_len: int, dtype: torch.dtype
) -> StageActivations:
    """Every chunk's input and output of a micro-batch of ``micro_batch_size`` x ``seq_len``
    tokens: token ids into the embedding's chunk, hidden states of ``dtype`` elsewhere and out
    of every chunk (the output layer's chunk returns its final-normed hidden states, as under a
    vocabulary layout split over the pipeline); under sequence parallelism, this rank's 1/t of
    the sequence."""
    shards = layout.tensor_parallel_degree if layout.sequence_parallel else 1
    hidden = (micro_batch_size, seq_len // shards, model.hidden_size)

    def activations(chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = chunk == embedding_chunk(layout)
        states = torch.empty(hidden, dtype=dtype, device="meta", requires_grad=True)
        ids = torch.empty(micro_batch_size, seq_len, dtype=torch.long, device="meta")
        return (ids if first else states), states

    return activations


def pipeline_step(
    schedule: PipelineSchedule, layout: Layout, stage: int, x: torch.Tensor, y: torch.Tensor
) -> list[torch.Tensor]:
    """Run one step of the schedule; the micro-batches' losses on the stage where the hidden
    states leave the pipeline, nothing elsewhere."""
    holds_last = chunk_stage(layout, output_chunk(layout)) == stage
    losses: list[torch.Tensor] = []
    target, sink = (y, losses) if holds_last else (None, None)
    # return_outputs=False: the last stage would otherwise keep every micro-batch's logits
    # until the step ends.
    if chunk_stage(layout, embedding_chunk(layout)) == stage:
        schedule.step(x, target=target, losses=sink, return_outputs=False)
    else:
        schedule.step(target=target, losses=sink, return_outputs=False)
    return losses


class TiedEmbedding:
    """The tied embedding matrix when the embedding and the output layer sit on different
    pipeline ranks: each holds a copy, and their gradients are summed before every update, in
    ``reduce_dtype`` (the plan's ``TrainingSpec.reduce_dtype``, as the cost model prices it)."""

    def __init__(self, model: ModelSpec, layout: Layout, *, reduce_dtype: torch.dtype) -> None:
        """Every rank calls this (it creates process groups)."""
        self.reduce_dtype = reduce_dtype
        self.group: dist.ProcessGroup | None = None
        """The (embedding rank, output-layer rank) pair of this rank's (dp, tp) coordinate, or None."""
        stages = tied_copy_stages(model, layout)
        if stages is None:
            return
        first, last = stages
        # Torch ranks from the geometry and the device map (as runtime.mesh.device_grid), not
        # from the mesh's tensor: under the dry run's fake tensors that tensor has no values.
        torch_rank = layout.device_map.device_of
        pairs = [
            sorted({torch_rank(rank_of(layout, first, d, t)), torch_rank(rank_of(layout, last, d, t))})
            for d in range(layout.dense_replicas)
            for t in range(layout.tensor_parallel_degree)
        ]
        mine, _ = dist.new_subgroups_by_enumeration(pairs)  # type: ignore[no-untyped-call]
        self.group = mine

    def sync(self, chunks: Sequence[Decoder]) -> None:
        """Sum the copies' gradients (after the backward, before the update)."""
        if self.group is None:
            return
        for chunk in chunks:
            for module in (chunk.tok_emb, chunk.head):
                if module is None or module.weight.grad is None:
                    continue
                grad, weight = module.weight.grad, module.weight
                if isinstance(grad, DTensor) and isinstance(weight, DTensor) and grad.placements != weight.placements:
                    # The embedding's backward may leave a replicated gradient of a sharded weight;
                    # both copies must be laid out alike to be summed shard by shard.
                    grad = grad.redistribute(weight.device_mesh, weight.placements)
                    module.weight.grad = grad
                mine = local(grad)
                summed = mine.to(self.reduce_dtype)  # the gradient itself where it has that precision
                dist.all_reduce(summed, group=self.group)
                if summed is not mine:
                    mine.copy_(summed)
