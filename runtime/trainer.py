"""A plan's layout as a training job: mesh, pipeline stages, tensor and data parallelism, and a
step that returns the global mean loss on every rank.

- Mesh (pp, dp, tp) with tp fastest, the planner's rank order (cost_models.groups.rank_of).
- Pipeline: each rank builds its model chunks from the full reference model (so parameters match
  the reference exactly), keeping the layers of the plan's split; torch.distributed.pipelining
  runs GPipe, 1F1B or interleaved 1F1B. A tied output layer on the last stage is a copy whose
  gradient is summed with the embedding's (as Megatron-LM does).
- Tensor parallel: q/k/v, gate/up column-wise, o/down row-wise, the embedding split by
  vocabulary, the output layer column-wise with a vocabulary-parallel loss (loss_parallel).
- Data parallel: ZeRO-0/1 through runtime.optim.DataParallelOptimizer (one flat all-reduce;
  ZeRO-1 shards the optimizer state and fp32 masters); ZeRO-2/3 are FSDP2 with
  reshard_after_forward False/True and bf16 compute over fp32 shards. Every stage reduces
  gradients in the plan's precision (the cost model's 2 bytes per parameter in bf16). Under a
  pipeline, torch.distributed.pipelining has FSDP keep each micro-batch's gradient whole and
  reduce once, after the stage's last backward (cost_models.pipeline.defers_gradient_reduction).
- Gradient accumulation: micro-batches of the plan; each loss is divided by their count.
"""

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from planner.schemas import DType, Layout, ModelSpec, Schedule, ZeroStage
from planner.schemas.geometry import chunk_layers, num_micro_batches, stage_chunks
from runtime.model import TORCH_DTYPES, Decoder, loss_fn, set_recompute
from runtime.optim import DataParallelOptimizer, local, make_optimizer


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
    ) -> None:
        """``mesh``: a (pp, dp, tp) mesh built beforehand (a dry run builds it outside fake tensors);
        ``pipeline_schedule``: False leaves the stages without a schedule (a dry run drives them);
        ``dtype``: bf16/fp16 train mixed precision: weights, gradients and activations in that
        precision, fp32 master weights in the optimizer (FSDP's fp32 shards under ZeRO-2/3).
        """
        self.model, self.layout, self.device, self.dtype = model, layout, device, dtype
        self.micro_batches = num_micro_batches(global_batch_size, layout)
        p, d, t = layout.pipeline_parallel_degree, layout.data_parallel_degree, layout.tensor_parallel_degree
        self.mesh: DeviceMesh = mesh or init_device_mesh(device.type, (p, d, t), mesh_dim_names=("pp", "dp", "tp"))
        self.pp_rank, self.dp_rank = self.mesh["pp"].get_local_rank(), self.mesh["dp"].get_local_rank()
        low = TORCH_DTYPES[dtype]
        # ZeRO-2/3 shard with FSDP; over one data-parallel rank there is nothing to shard, and
        # FSDP would still gather and reduce every unit of every micro-batch (as the cost model
        # says, ZeRO is then ZeRO-0).
        self.fsdp = layout.zero_stage >= ZeroStage.GRADIENTS and d > 1
        # ZeRO-0/1 keep the model in the plan's precision (fp32 masters live in the optimizer);
        # ZeRO-2/3 keep fp32 shards that FSDP gathers in that precision.
        with default_dtype(torch.float32 if self.fsdp else low):
            self.chunks = [self._chunk(c, seed) for c in stage_chunks(layout, self.pp_rank)]
        for chunk in self.chunks:
            set_recompute(chunk, layout.recompute)
            if t > 1:
                tensor_parallel(chunk, self.mesh["tp"], sequence_parallel=layout.sequence_parallel)
            if device.type != "cpu":  # built on the CPU already (and fake tensors cannot be moved in place)
                chunk.to(device)
        self._tie_group = self._tied_copy_group()
        params = [q for chunk in self.chunks for q in chunk.parameters()]
        if self.fsdp:
            for chunk in self.chunks:
                shard_units(chunk.layers.values(), chunk, self.mesh["dp"], zero_stage=layout.zero_stage, dtype=low)
            params = [q for chunk in self.chunks for q in chunk.parameters()]
            self.optimizer: DataParallelOptimizer | torch.optim.Optimizer = make_optimizer(optimizer, params, lr)
        else:
            self.optimizer = DataParallelOptimizer(
                optimizer, params, lr, self.mesh["dp"].get_group(), shard=layout.zero_stage is ZeroStage.OPTIMIZER
            )
        self.params = params
        self.report_loss = True
        """False in a dry run: reading a loss's value needs real tensors."""
        self.fresh_roots = False
        """True while memory is tracked: each micro-batch calls its chunk through a new wrapper
        module, because torch's MemTracker refuses a root module called twice in one step."""
        self.schedule = self._schedule() if p > 1 and pipeline_schedule else None

    # -- construction -------------------------------------------------------------------------

    def _chunk(self, c: int, seed: int) -> Decoder:
        """Model chunk ``c``: its layers, plus the embedding on the first and the head on the last
        (with the same values as the reference: every parameter is seeded by its name)."""
        counts = chunk_layers(self.model, self.layout)
        first, n = sum(counts[:c]), len(counts)
        return Decoder(
            self.model, seed=seed, layers=range(first, first + counts[c]), embedding=c == 0, output=c == n - 1
        )

    def _tied_copy_group(self) -> dist.ProcessGroup | None:
        """The (first stage, last stage) pair sharing this rank's (dp, tp) coordinate, when the
        tied embedding lives on two pipeline ranks."""
        if not self.model.tie_word_embeddings or self.layout.num_chunks == 1:
            return None
        p = self.layout.pipeline_parallel_degree
        pairs = []
        for d in range(self.layout.data_parallel_degree):
            for t in range(self.layout.tensor_parallel_degree):
                ranks = self.mesh.mesh[:, d, t].tolist()
                pairs.append(sorted({ranks[0], ranks[p - 1]}))
        if p == 1:
            return None  # one rank holds every chunk: both copies are local
        mine, _ = dist.new_subgroups_by_enumeration(pairs)  # type: ignore[no-untyped-call]
        return mine  # type: ignore[no-any-return]

    def _schedule(self) -> ScheduleGPipe | Schedule1F1B | ScheduleInterleaved1F1B:
        layout = self.layout
        n = layout.num_chunks
        stages: list[_PipelineStageBase] = [
            PipelineStage(chunk, c, n, self.device, group=self.mesh["pp"].get_group())
            for chunk, c in zip(self.chunks, stage_chunks(layout, self.pp_rank), strict=True)
        ]
        m = self.micro_batches
        if layout.schedule is Schedule.INTERLEAVED:
            return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
        cls = ScheduleGPipe if layout.schedule is Schedule.GPIPE else Schedule1F1B
        return cls(stages[0], n_microbatches=m, loss_fn=loss_fn)

    # -- training ---------------------------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Train on the global batch (every rank passes all of it); the global mean loss."""
        d = self.layout.data_parallel_degree
        rows = inputs.shape[0] // d
        mine = slice(self.dp_rank * rows, (self.dp_rank + 1) * rows)
        x, y = inputs[mine].to(self.device), targets[mine].to(self.device)
        self.optimizer.zero_grad()
        with self._loss_context():
            loss = self._pipeline_step(x, y) if self.schedule is not None else self._local_step(x, y)
        self._sync_tied()
        self.optimizer.step()
        if not self.report_loss:
            return 0.0
        total = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(total)  # every (dp, tp) copy of the last stage reports its replica's loss
        return float(total.item()) / (d * self.layout.tensor_parallel_degree)

    def _local_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        m = self.micro_batches
        total = 0.0
        for i, (xb, yb) in enumerate(zip(x.chunk(m), y.chunk(m), strict=True)):
            if self.fsdp and self.layout.zero_stage is ZeroStage.GRADIENTS:
                # ZeRO-2 keeps the gathered weights until the step's last backward (the cost
                # model's m reduce-scatters and one all-gather); ZeRO-3 gathers them each time.
                cast(FSDPModule, self.chunks[0]).set_reshard_after_backward(i == m - 1)
            module = OneCall(self.chunks[0]) if self.fresh_roots else self.chunks[0]
            loss = loss_fn(module(xb), yb) / m
            torch.autograd.backward(loss)
            total += _value(loss) if self.report_loss else 0.0
        return total

    def _pipeline_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        assert self.schedule is not None
        holds_first = 0 in stage_chunks(self.layout, self.pp_rank)
        holds_last = self.layout.num_chunks - 1 in stage_chunks(self.layout, self.pp_rank)
        losses: list[torch.Tensor] = []
        target, sink = (y, losses) if holds_last else (None, None)
        # return_outputs=False: the last stage would otherwise keep every micro-batch's logits
        # until the step ends (measured: 23.0 MiB instead of 12.4 on tiny-gpt's last of 4 stages).
        if holds_first:
            self.schedule.step(x, target=target, losses=sink, return_outputs=False)
        else:
            self.schedule.step(target=target, losses=sink, return_outputs=False)
        if not holds_last:
            return 0.0
        return sum(_value(loss) for loss in losses) / len(losses)

    def _loss_context(self) -> AbstractContextManager[None]:
        """The vocabulary-parallel loss under tensor parallelism."""
        return loss_parallel() if self.layout.tensor_parallel_degree > 1 else nullcontext()

    def _sync_tied(self) -> None:
        if self._tie_group is None:
            return
        for chunk in self.chunks:
            for module in (chunk.tok_emb, chunk.head):
                if module is None or module.weight.grad is None:
                    continue
                grad, weight = module.weight.grad, module.weight
                if isinstance(grad, DTensor) and isinstance(weight, DTensor) and grad.placements != weight.placements:
                    # The embedding's backward may leave a replicated gradient of a sharded weight;
                    # both copies must be laid out alike to be summed shard by shard.
                    grad = grad.redistribute(weight.device_mesh, weight.placements)
                    module.weight.grad = grad
                dist.all_reduce(local(grad), group=self._tie_group)

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


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built inside get parameters of ``dtype``."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _value(t: torch.Tensor) -> float:
    """A scalar loss as a float (a vocabulary-parallel loss is a replicated DTensor)."""
    return float((t.full_tensor() if isinstance(t, DTensor) else t).detach().item())


def tensor_parallel(chunk: Decoder, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallelism; with sequence parallelism the norms and the residual
    stream hold 1/t of the sequence, gathered before attention and the MLP and reduce-scattered
    after them (Korthikanti et al. 2022, sec. 4.2.2)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    for i, block in chunk.layers.items():
        plan |= {f"layers.{i}.attn.{n}": ColwiseParallel() for n in ("q", "k", "v")}
        plan[f"layers.{i}.attn.o"] = RowwiseParallel(output_layouts=seq)
        plan |= {f"layers.{i}.mlp.{n}": ColwiseParallel() for n in ("gate", "up") if getattr(block.mlp, n) is not None}
        plan[f"layers.{i}.mlp.down"] = RowwiseParallel(output_layouts=seq)
        if sequence_parallel:
            plan |= {f"layers.{i}.{n}": SequenceParallel() for n in ("norm1", "norm2")}
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan |= {f"layers.{i}.attn": gather, f"layers.{i}.mlp": gather}
    if chunk.tok_emb is not None:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
        if sequence_parallel:
            chunk.to_sequence_shards = partial(_scatter_sequence, mesh=tp_mesh)
    if chunk.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if chunk.head is not None:
        plan["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    tied = chunk.tok_emb is not None and chunk.head is not None and chunk.head.weight is chunk.tok_emb.weight
    parallelize_module(chunk, tp_mesh, plan)  # type: ignore[arg-type]
    if tied:
        assert chunk.head is not None and chunk.tok_emb is not None
        chunk.head.weight = chunk.tok_emb.weight


def _scatter_sequence(h: torch.Tensor, *, mesh: DeviceMesh) -> torch.Tensor:
    """A replicated (b, s, h) activation to this rank's slice of the sequence; the backward
    all-gathers the gradient, so replicated parameters before it (positions) get it whole."""
    return DTensor.from_local(h, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local()


def shard_units(
    units: Iterable[nn.Module], root: nn.Module, dp_mesh: DeviceMesh, *, zero_stage: ZeroStage, dtype: torch.dtype
) -> None:
    """ZeRO-2/3 as the runtime shards (FSDP2): each unit, then the root with what remains, over
    ``dp_mesh``; fp32 shards gathered, computed and reduced in ``dtype``; ZeRO-3 reshards after
    each forward. The profiler times its own cost this way (profiler.ops)."""
    reshard = zero_stage is ZeroStage.PARAMETERS
    # fp32 shards are the master weights; layers gather, compute and reduce in the plan's
    # precision (as ZeRO-0/1 reduce: measured, an fp32 reduce-scatter doubled the bytes).
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(root, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
