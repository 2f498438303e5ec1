"""A plan's layout as a training job: one rank's part, composed from one module per parallelism,
with a step that returns the global mean loss on every rank.

- ``runtime.mesh``: the (pp, dp, tp) mesh, the layout's DeviceMap deciding which process plays
  which rank.
- ``runtime.pipeline``: this rank's model chunks, their schedule and the tied embedding's copy.
- ``runtime.tensor_parallel``: each chunk's tensor (and sequence) parallel split, every
  expert's too, and the routers' partial gradients summed over the tensor-parallel group.
- ``runtime.vocabulary_parallel``: under ``vocab-1``/``vocab-2``, this rank's rows of the
  embedding and output layer and the passes every pipeline rank joins.
- ``runtime.expert_parallel``: under expert parallelism, the experts this rank holds (the
  placement table) and their token exchange over the (pp, edp, ep, tp) expert mesh (with the
  experts folded, over a stage's d t ranks: ``runtime.mesh.expert_mesh``).
- ``runtime.context_share``: under context parallelism, this rank's share of every
  sequence and attention over the whole sequences (over the (pp, batch, cp, tp) context mesh,
  ``runtime.mesh.context_mesh``).
- ``runtime.data_parallel``: the replica's rows of the batch, ZeRO's sharing and the optimizer
  (in sharding groups, HSDP, and with a secondary partition, over ``runtime.mesh.sharding_meshes``).
- Gradient accumulation: micro-batches of the plan; each loss is divided by their count.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from planner.schemas import DType, Layout, ModelSpec
from planner.schemas.fp8 import RecipeRun
from planner.schemas.geometry import ContextMeshAxis, ExpertMeshAxis, MeshAxis, num_micro_batches, pipeline_schedules
from planner.schemas.layout import check_experts
from planner.schemas.runtime_support import check_pipeline_flushes
from planner.schemas.training import default_reduce_dtype
from runtime.context_parallel import SentBytes
from runtime.context_share import ContextShare
from runtime.data_parallel import DataParallel, Optimizer, parameters
from runtime.expert_parallel import (
    JointOptimizer,
    PlacementTable,
    ReplicaGradients,
    check_placement,
    expert_parallel,
    hosted_experts,
    placement_table,
    replicated,
)
from runtime.fp8 import convert_to_fp8, edge_layers, precompute_fp8_scales
from runtime.mesh import ShardingMeshes, context_mesh, expert_mesh, layout_mesh, sharding_meshes
from runtime.model import TORCH_DTYPES, Decoder, default_dtype, loss_fn, set_activation_offload, set_recompute
from runtime.pipeline import (
    PipelineSchedule,
    TiedEmbedding,
    build_chunks,
    build_schedule,
    pipeline_step,
    stage_activations,
)
from runtime.tensor_parallel import PartialGradients, loss_context, tensor_parallel
from runtime.vocabulary_parallel import VocabularyParallel


class Trainer:
    """One rank's part of a layout; ``step`` trains on a global batch and returns its mean loss."""

    def __init__(
        self,
        model: ModelSpec,
        layout: Layout,
        *,
        global_batch_size: int,
        seed: int,
        optimizer: str,
        lr: float,
        device: torch.device,
        mesh: DeviceMesh | None = None,
        pipeline_schedule: bool = True,
        dtype: DType = DType.FP32,
        reduce_dtype: DType | None = None,
        placement: PlacementTable | None = None,
        experts_mesh: DeviceMesh | None = None,
        sharding: ShardingMeshes | None = None,
        contexts_mesh: DeviceMesh | None = None,
        pipeline_flushes: int = 1,
        fp8: RecipeRun | None = None,
        fp8_param_gather: bool = False,
        fp8_bf16_layers: int = 0,
        plan_checked: bool = False,
    ) -> None:
        """``mesh``: the layout's mesh built beforehand (a dry run builds it outside fake tensors);
        ``pipeline_schedule``: False leaves the stages without a schedule (a dry run drives them, and
        any vocabulary passes: ``VocabularyParallel.begin_step``'s ``serve``);
        ``dtype``: bf16/fp16 train mixed precision: weights, gradients and activations in that
        precision, fp32 master weights in the optimizer (FSDP's fp32 shards under ZeRO-2/3);
        ``reduce_dtype``: the precision data-parallel gradients are summed in (default
        ``schemas.training.default_reduce_dtype``: fp32 under bf16);
        ``placement``: an MoE model's experts on each expert-parallel rank, by MoE layer (default
        the layout's, ``runtime.expert_parallel.placement_table``); ``experts_mesh``: the
        layout's expert mesh built beforehand, as ``mesh`` (default: built here when needed);
        ``sharding``: the meshes ZeRO shares the states over built beforehand, as ``mesh``
        (default: ``runtime.mesh.sharding_meshes``, built here); ``contexts_mesh``: under context
        parallelism the layout's context mesh built beforehand, as ``mesh`` (default: built here);
        ``pipeline_flushes``: the pipeline schedules a step runs (``TrainingSpec.pipeline_flushes``),
        each over its share of the micro-batches, gradients accumulated between them;
        ``fp8``: the FP8 recipe the transformer layers' linear layers train with
        (``TrainingSpec.precision.fp8``; ``runtime.fp8``), with ``fp8_param_gather`` their weights
        all-gathered in FP8 and the first and last ``fp8_bf16_layers`` layers kept in the training
        precision; ``plan_checked``: the caller refused what the runtime cannot run with
        ``schemas.runtime_support.check_runnable`` (``runtime.run`` does, before any work), so the
        pipeline flushes are not checked again here.
        """
        check_experts(model, layout)
        self.model, self.layout, self.device, self.dtype = model, layout, device, dtype
        self.fp8, self.fp8_param_gather = fp8, fp8_param_gather
        self.fp8_kept = edge_layers(model.num_hidden_layers, fp8_bf16_layers)
        self.global_batch_size = global_batch_size
        self.micro_batches = num_micro_batches(global_batch_size, layout)
        if not plan_checked:
            check_pipeline_flushes(layout, pipeline_flushes)
        self.flushes = pipeline_schedules(layout, pipeline_flushes)
        """Pipeline schedules a step runs; each runs ``micro_batches // flushes`` micro-batches."""
        self.mesh: DeviceMesh = mesh or layout_mesh(layout, device.type)
        self.pp_rank = self.mesh[MeshAxis.PP].get_local_rank()
        self.placement = placement or placement_table(model, layout)
        check_placement(model, layout, self.placement)
        experts_mesh = _own_experts_mesh(layout, device, experts_mesh)
        self.data_parallel = DataParallel(
            layout,
            self.mesh[MeshAxis.DP],
            experts_mesh[ExpertMeshAxis.EDP] if experts_mesh else None,
            sharding or sharding_meshes(layout, device.type, self.mesh),
        )
        self.context: ContextShare | None = _context_share(layout, device, contexts_mesh)
        """Under context parallelism: this rank's share of each sequence and its group."""
        compute = TORCH_DTYPES[dtype]
        self.chunks = self._build_chunks(seed, compute, experts_mesh)
        reduce = TORCH_DTYPES[default_reduce_dtype(dtype) if reduce_dtype is None else reduce_dtype]
        self.tied = TiedEmbedding(model, layout, reduce_dtype=reduce)
        self.vocabulary: VocabularyParallel | None = self._vocabulary(seed, compute)
        """Under a vocabulary layout split over the pipeline: this rank's shards and passes."""
        self.optimizer: Optimizer = self._optimizer(optimizer, lr, compute, reduce, experts_mesh)
        self.params = parameters(self.chunks) + (self.vocabulary.parameters() if self.vocabulary else [])
        self.report_loss = True
        """False in a dry run: reading a loss's value needs real tensors."""
        self.fp8_scales_after_step = fp8_param_gather and self.data_parallel.shards_with_fsdp
        """Whether each step ends computing the scales of the weights FSDP gathers in FP8
        (``runtime.fp8.precompute_fp8_scales``); False in a dry run, where torchao's weight wrapper
        reads the precomputed scale's value (a scalar per weight, nothing to trace)."""
        self.fresh_roots = False
        """True while memory is tracked: each micro-batch calls its chunk through a new wrapper
        module, because torch's MemTracker refuses a root module called twice in one step."""
        self.schedule: PipelineSchedule | None = None
        self._schedule_seq_len = 0
        """The sequence length the schedule was built for (vocabulary layouts give theirs up front)."""
        if layout.pipeline_parallel_degree > 1 and pipeline_schedule and self.vocabulary is None:
            self.schedule = self._build_schedule()

    def _build_chunks(self, seed: int, compute: torch.dtype, experts_mesh: DeviceMesh | None) -> list[Decoder]:
        """This rank's model chunks, built in the parameters' precision and then split: FP8 linear
        layers swapped in (``fp8``), recompute set, the context share held, the experts exchanged
        over ``experts_mesh``'s ep axis and the tensor-parallel split applied, as the layout asks;
        moved to the device last."""
        model, layout, device = self.model, self.layout, self.device
        place = experts_mesh[ExpertMeshAxis.EP].get_local_rank() if experts_mesh else 0
        with default_dtype(self.data_parallel.parameter_dtype(compute)):
            held = hosted_experts(model, self.placement, place) if experts_mesh else None
            chunks = build_chunks(model, layout, self.pp_rank, seed=seed, experts=held)
        for chunk in chunks:
            if self.fp8 is not None:  # before any split or sharding wraps the layers
                convert_to_fp8(chunk, self.fp8, param_gather=self.fp8_param_gather, kept=self.fp8_kept)
            full_layers = None if layout.recompute_layers is None else layout.recompute_layers[self.pp_rank]
            set_recompute(chunk, layout.recompute, layout.recompute_modules, full_layers=full_layers)
            set_activation_offload(chunk, layout.activation_offload_layers)
            if self.context is not None:
                self.context.hold(chunk)
            if experts_mesh is not None and layout.expert_parallel_degree > 1:
                expert_parallel(chunk, model, self.placement, experts_mesh[ExpertMeshAxis.EP].get_group())
            if layout.tensor_parallel_degree > 1:
                tensor_parallel(
                    chunk,
                    self.mesh[MeshAxis.TP],
                    sequence_parallel=layout.sequence_parallel,
                    fold_experts=layout.folds_experts,
                )
            if device.type != "cpu":  # built on the CPU already (and fake tensors cannot be moved in place)
                chunk.to(device)
        return chunks

    def _vocabulary(self, seed: int, compute: torch.dtype) -> VocabularyParallel | None:
        """Under a vocabulary layout split over the pipeline, this rank's shards (which then embed
        the tokens of the chunks that take them); None otherwise."""
        if not self.layout.vocabulary_layout.over_pipeline:
            return None
        with default_dtype(self.data_parallel.parameter_dtype(compute)):
            vocabulary = VocabularyParallel(self.model, self.layout, self.mesh, seed=seed, compute_dtype=compute)
        for chunk in self.chunks:
            if chunk.takes_tokens:
                chunk.embed_tokens = vocabulary.embed
        return vocabulary

    def _optimizer(
        self, optimizer: str, lr: float, compute: torch.dtype, reduce: torch.dtype, experts_mesh: DeviceMesh | None
    ) -> Optimizer:
        """The data-parallel optimizer over this rank's parameters, joined by the reductions it
        does not make itself: the partial gradients of the weights every tensor-parallel rank holds
        whole (MoE routers, shared experts' gates, q/k norms: ``PartialGradients``), and
        replicated experts' gradients over the expert-parallel group."""
        model, layout = self.model, self.layout
        joint: Optimizer = self.data_parallel.share(
            self.chunks,
            optimizer=optimizer,
            lr=lr,
            compute_dtype=compute,
            reduce_dtype=reduce,
            outside=self.vocabulary.parameters() if self.vocabulary else (),
        )
        tp_mesh = self.mesh[MeshAxis.TP]
        partials = model.is_moe or model.qk_norm  # routers, shared experts' gates, q/k norms (runtime.tensor_parallel)
        if partials and layout.tensor_parallel_degree > 1:
            joint = JointOptimizer([PartialGradients(self.chunks, tp_mesh.get_group()), joint])
        if experts_mesh is not None and replicated(self.placement):
            ep_group = experts_mesh[ExpertMeshAxis.EP].get_group()
            copies = ReplicaGradients(
                self.chunks,
                model,
                self.placement,
                ep_group,
                tensor_rank=0 if layout.folds_experts else tp_mesh.get_local_rank(),
                tensor_degree=layout.expert_tensor_degree,
            )
            joint = JointOptimizer([copies, joint])
        return joint

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel replica."""
        return self.data_parallel.mesh.get_local_rank()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Train on the global batch (every rank passes all of it); the global mean loss."""
        mine = self.data_parallel.rows(inputs.shape[0])
        x, y = inputs[mine], targets[mine]
        if self.context is not None:
            x, y = self.context.split(x), self.context.split(y)
        x, y = x.to(self.device), y.to(self.device)
        self.optimizer.zero_grad()
        if self.vocabulary is not None and self._schedule_seq_len != x.shape[1]:
            self.schedule, self._schedule_seq_len = self._build_schedule(x.shape[1]), x.shape[1]
        with self.loss_context():
            if self.schedule is not None:
                if self.vocabulary is not None:
                    self.vocabulary.begin_step(x, y, self.micro_batches)
                losses = [  # each schedule its share of the micro-batches; gradients accumulate
                    loss
                    for xs, ys in zip(x.chunk(self.flushes), y.chunk(self.flushes), strict=True)
                    for loss in pipeline_step(self.schedule, self.layout, self.pp_rank, xs, ys)
                ]
                if self.vocabulary is not None:
                    self.vocabulary.end_step()
                # only the output layer's stage has losses; over several schedules each is already
                # its micro-batch's share of the step's mean (pipeline.build_schedule)
                summed = sum(_value(part) for part in losses)
                loss = (summed if self.flushes > 1 else summed / len(losses)) if losses else 0.0
            else:
                loss = self._local_step(x, y)
        self.tied.sync(self.chunks)
        self.optimizer.step()
        if self.fp8_scales_after_step:
            precompute_fp8_scales(self.chunks)
        if not self.report_loss:
            return 0.0
        # on the compute device: NCCL takes only CUDA tensors (gloo, CPU ones)
        total = torch.tensor([loss], dtype=torch.float64, device=self.device)
        # every (dp, cp, tp) rank of the output layer's stage reports its share's mean loss (cp's
        # shares hold equal token counts, so their mean is the replica's)
        dist.all_reduce(total)
        return float(total.item()) / (self.layout.dense_replicas * self.layout.tensor_parallel_degree)

    def _build_schedule(self, seq_len: int | None = None) -> PipelineSchedule:
        """The pipeline schedule; under a vocabulary layout split over the pipeline, with its loss
        and the stages' activations for sequences of ``seq_len`` given up front."""
        pp_mesh = self.mesh[MeshAxis.PP]
        if self.vocabulary is None:
            per_schedule, step = self.micro_batches // self.flushes, self.micro_batches if self.flushes > 1 else None
            return build_schedule(
                self.chunks, self.layout, self.pp_rank, self.device, pp_mesh, per_schedule, step_micro_batches=step
            )
        assert seq_len is not None
        activations = stage_activations(
            self.layout, self.model, self.layout.micro_batch_size, seq_len, TORCH_DTYPES[self.dtype]
        )
        return build_schedule(
            self.chunks,
            self.layout,
            self.pp_rank,
            self.device,
            pp_mesh,
            self.micro_batches,
            loss=self.vocabulary.loss,
            activations=activations,
        )

    def modules(self) -> list[nn.Module]:
        """The modules holding this rank's parameters: its chunks and any vocabulary shards."""
        return [*self.chunks, *([self.vocabulary.shards] if self.vocabulary else [])]

    def _local_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        m = self.micro_batches
        total = 0.0
        for i, (xb, yb) in enumerate(zip(x.chunk(m), y.chunk(m), strict=True)):
            self.data_parallel.before_micro_batch(self.chunks[0], i, m)
            module = OneCall(self.chunks[0]) if self.fresh_roots else self.chunks[0]
            loss = loss_fn(module(xb), yb) / m
            torch.autograd.backward(loss)
            total += _value(loss) if self.report_loss else 0.0
        return total

    def loss_context(self) -> AbstractContextManager[None]:
        """Where the loss and its backward run (the vocabulary-parallel loss under tensor parallelism)."""
        return loss_context(self.layout.tensor_parallel_degree)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters."""
        return iter(self.params)


class OneCall(nn.Module):
    """Calls ``module`` once: a fresh root for each micro-batch (see ``Trainer.fresh_roots``)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(x)
        return out


def _own_experts_mesh(layout: Layout, device: torch.device, experts_mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The expert mesh when the experts have their own groups (``experts_mesh``, or built here);
    None otherwise. Folded experts (whole on each rank) are reduced over their own group even
    without expert parallelism."""
    own_experts = layout.expert_parallel_degree > 1 or layout.folds_experts
    if own_experts and experts_mesh is None:
        experts_mesh = expert_mesh(layout, device.type)
    return experts_mesh if own_experts else None


def _context_share(layout: Layout, device: torch.device, contexts_mesh: DeviceMesh | None) -> ContextShare | None:
    """Under context parallelism, this rank's share of each sequence over the cp axis of
    ``contexts_mesh`` (or of the context mesh built here); None otherwise."""
    if layout.context_parallel_degree <= 1:
        return None
    cp_mesh = (contexts_mesh or context_mesh(layout, device.type))[ContextMeshAxis.CP]
    return ContextShare(
        layout.context_parallel_degree,
        cp_mesh.get_local_rank(),
        cp_mesh.get_group(),
        SentBytes(),
        layout.context_parallel_kind,
    )


def _value(t: torch.Tensor) -> float:
    """A scalar loss as a float (a vocabulary-parallel loss is a replicated DTensor)."""
    return float((t.full_tensor() if isinstance(t, DTensor) else t).detach().item())
