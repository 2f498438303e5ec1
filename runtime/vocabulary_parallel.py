"""Vocabulary Parallelism (Yeung et al., MLSys 2025, arXiv 2411.05288) on torch's fixed pipeline
schedules: the input embedding and the output layer split by vocabulary rows over every pipeline
rank (``schemas.geometry.vocabulary_rows``), both of the paper's algorithms executed by one
synchronous mechanism.

The paper interleaves its vocabulary passes with the transformer's in a schedule of its own, with
extra warm-up micro-batches; torch.distributed.pipelining's 1F1B cannot express that. Here every
pass runs when the stage that needs it reaches it, per micro-batch:

- Embedding forward: when the first stage embeds a micro-batch, every pipeline rank looks up the
  rows it holds (zeros for the other tokens) and the partial embeddings are summed to the first
  stage. Every rank reads the step's whole batch, so the token ids (and the targets) of each
  micro-batch are known everywhere without being sent.
- Embedding backward: the first stage broadcasts the gradient of the embedded tokens; every rank
  accumulates its rows' weight gradient.
- Output layer and loss: when the last stage's loss function runs, it broadcasts the final-normed
  hidden states X (b, s, h); every rank computes its logits X W_r^T in fp32 (as ``model.loss_fn``
  casts them), the per-token max, sum of exp and target logit are all-reduced (the target logit
  from the rank holding the target's row) and the last stage forms the mean cross-entropy. The
  gradient of the logits, (softmax - onehot) / tokens, is known in that same pass, so each rank
  computes its partial dX = g W_r and its weight gradient g^T X; the partial dX are summed to the
  last stage (in fp32), whose loss returns them from its backward. vocab-1 (Algorithm 1) forms g
  after the statistics' all-reduce; vocab-2 (Algorithm 2) multiplies the locally normalised
  softmax by W_r before it and rescales that by each token's share of the global sum after
  (the paper's Algorithm 2; its authors' sail-sg/VocabularyParallelism, ``vocab_output.py``):
  same values and FLOPs, and here neither overlaps the transformer, so the two differ only in
  rounding.

The rank whose schedule triggers a pass (the first stage for the embedding, the last for the
output layer) joins it from its schedule; every other pipeline rank joins from a service thread,
one per kind of pass, on a process group of that kind (one per (dp, tp) coordinate, all created
up front in the same order on every rank), so each group's collectives run in micro-batch order
on every rank while the ranks' own schedules go on. The threads serve one step's micro-batches
and are joined before the optimizer step. Weight gradients are accumulated by hand (one buffer
per kind of pass, so no two threads write one tensor), already divided by the micro-batch count
as the schedule divides its stages' gradients. The data-parallel replicas average the shards'
gradients with the others' (``runtime.data_parallel``).

Under tensor parallelism every tensor-parallel rank of a stage holds that stage's rows (the split
is over the pipeline only, as ``vocabulary_rows`` says; the paper splits over p t ranks), so each
(dp, tp) coordinate's pipeline ranks repeat the vocabulary work of the others. Under sequence
parallelism each tensor-parallel rank of the last stage runs the output passes of its 1/t of the
sequence, and the shards' output-layer gradients are summed over the tensor-parallel group.

Memory tracking on CPU (torch's MemTracker, a dispatch mode, which is per thread) sees what a
rank runs from its schedule, not its service threads' transient tensors: on a rank other than the
last, an output pass's fp32 logits shard (b s V/p) and what is derived from it go uncounted. The
dry run (``runtime.dry_run``) runs a rank's peer passes in its own thread, where they are.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.device_mesh import DeviceMesh

from planner.schemas import Layout, ModelSpec, VocabularyLayout
from planner.schemas.geometry import MeshAxis, chunk_stage, embedding_chunk, output_chunk, rank_of, vocabulary_rows
from runtime.model import initial_value


class VocabularyShards(nn.Module):
    """One pipeline rank's rows of the input embedding and of the output layer: the reference's
    full matrices (seeded by their names, ``model.initial_value``) sliced by rows. Tied, one
    parameter serves both (the output layer's rows are the embedding's)."""

    def __init__(self, model: ModelSpec, rows: range, *, seed: int) -> None:
        super().__init__()
        full = (model.vocab_size, model.hidden_size)
        self.embedding = nn.Parameter(initial_value(seed, "tok_emb.weight", full)[rows.start : rows.stop].clone())
        self.output = (
            self.embedding
            if model.tie_word_embeddings
            else nn.Parameter(initial_value(seed, "head.weight", full)[rows.start : rows.stop].clone())
        )


@dataclass(frozen=True, slots=True)
class _Groups:
    """This rank's process groups of its pipeline line, one per kind of pass, and the torch ranks
    of the line's first and last stage."""

    embedding_forward: dist.ProcessGroup
    embedding_backward: dist.ProcessGroup
    output: dist.ProcessGroup
    first_rank: int
    last_rank: int


def _groups(layout: Layout, mesh: DeviceMesh) -> _Groups:
    """Every rank calls this, in the same order: it creates each kind's groups of every line."""
    # Torch ranks from the geometry and the device map (as runtime.mesh.device_grid), not from the
    # mesh's tensor: under the dry run's fake tensors that tensor has no values.
    device = layout.device_map.device_of
    p = layout.pipeline_parallel_degree
    lines = [
        [device(rank_of(layout, s, d, t)) for s in range(p)]
        for d in range(layout.dense_replicas)
        for t in range(layout.tensor_parallel_degree)
    ]
    kinds = []
    for _ in range(3):
        mine, _all = dist.new_subgroups_by_enumeration([sorted(line) for line in lines])  # type: ignore[no-untyped-call]
        kinds.append(mine)
    me = dist.get_rank()
    (line,) = [line for line in lines if me in line]
    first, last = chunk_stage(layout, embedding_chunk(layout)), chunk_stage(layout, output_chunk(layout))
    return _Groups(kinds[0], kinds[1], kinds[2], line[first], line[last])


class VocabularyParallel:
    """One rank's part of the vocabulary layers under ``vocab-1``/``vocab-2`` (see the module's
    docstring). Every rank builds it (it creates process groups). Per step: ``begin_step`` starts
    the service threads, the schedule calls ``embed`` (first stage) and ``loss`` (last stage),
    ``end_step`` joins the threads and sets the shards' gradients."""

    def __init__(
        self, model: ModelSpec, layout: Layout, mesh: DeviceMesh, *, seed: int, compute_dtype: torch.dtype
    ) -> None:
        """Build the shards in the default dtype (the chunks' parameter precision); the passes
        compute in ``compute_dtype``, the activations' precision (below fp32 shards under
        ZeRO-2/3, as FSDP computes its chunks), logits and their statistics in fp32."""
        self.compute_dtype = compute_dtype
        self.layout = layout
        stage = mesh[MeshAxis.PP].get_local_rank()
        self.rows = vocabulary_rows(model.vocab_size, layout, stage)
        self.shards = VocabularyShards(model, self.rows, seed=seed)
        self.groups = _groups(layout, mesh)
        self.tp_group = mesh[MeshAxis.TP].get_group() if layout.sequence_parallel else None
        self.sequence_shards = layout.tensor_parallel_degree if layout.sequence_parallel else 1
        """Under sequence parallelism the last stage's tensor-parallel ranks each hold 1/t of the
        sequence: each runs the output passes of its shard, with its share of the targets."""
        self.sequence_shard = mesh[MeshAxis.TP].get_local_rank() if layout.sequence_parallel else 0
        self.first = stage == chunk_stage(layout, embedding_chunk(layout))
        self.last = stage == chunk_stage(layout, output_chunk(layout))
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._scale = 1.0
        self._embedding_grad: torch.Tensor | None = None
        self._output_grad: torch.Tensor | None = None

    # ---- one step

    def begin_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int, *, serve: bool = True
    ) -> list[list[Callable[[], object]]]:
        """Before the schedule's step: this replica's ``inputs`` and ``targets`` (b m, s), split
        into micro-batches as the schedule splits them; start the service threads.

        Returns the passes this rank joins as a peer, one list per kind, in micro-batch order.
        With ``serve`` False no thread is started and the caller runs them: a dry run, whose
        fake process group has no peers to wait for, runs them in its own thread, where its
        memory is tracked."""
        ids, labels = torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)
        self._scale = 1.0 / micro_batches
        # allocated here, in the step's thread, where memory tracking sees them (as gradients)
        self._embedding_grad = self.shards.embedding.grad = torch.zeros_like(self.shards.embedding)
        self._output_grad = torch.zeros_like(self.shards.output)
        if self.shards.output is not self.shards.embedding:
            self.shards.output.grad = self._output_grad
        self._errors = []
        kinds: list[list[Callable[[], object]]] = []  # one service thread each
        if not self.first:
            kinds.append([partial(self._embedding_forward, x) for x in ids])
            kinds.append([partial(self._embedding_backward, x, None) for x in ids])
        if not self.last:
            kinds.append([partial(self._output_pass, None, self._my_targets(y)) for y in labels])
        if serve:
            self._threads = [threading.Thread(target=self._serve, args=(kind,), daemon=True) for kind in kinds]
            for thread in self._threads:
                thread.start()
        return kinds

    def _serve(self, passes: list[Callable[[], object]]) -> None:
        """A service thread: one kind of pass for each of the step's micro-batches, in order."""
        try:
            for run_pass in passes:
                run_pass()
        except BaseException as e:  # re-raised by end_step, in the step's thread
            self._errors.append(e)

    def end_step(self) -> None:
        """After the schedule's step, before the update: join the threads; a tied shard's
        gradient sums its embedding's and its output layer's."""
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._errors:
            raise self._errors[0]
        assert self._embedding_grad is not None and self._output_grad is not None
        if self.sequence_shards > 1:  # each tensor-parallel rank's output passes saw its shard of the sequence
            dist.all_reduce(self._output_grad, group=self.tp_group)
        if self.shards.output is self.shards.embedding:
            self._embedding_grad.add_(self._output_grad)
        self._embedding_grad = self._output_grad = None

    def parameters(self) -> list[nn.Parameter]:
        """This rank's vocabulary shards (one parameter when tied)."""
        return list(self.shards.parameters())

    # ---- what the first and last stage call

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The first stage's token embedding of a micro-batch (b, s) -> (b, s, h), summed over the
        pipeline ranks' rows; its backward runs the embedding backward pass."""
        out: torch.Tensor = _EmbedTokens.apply(ids, self.shards.embedding, self)  # type: ignore[no-untyped-call]
        return out

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of a micro-batch: mean cross-entropy of the final-normed hidden
        states (b, s, h) over the vocabulary split across the pipeline ranks. Under sequence
        parallelism the mean over this rank's 1/t of the sequence (the tensor-parallel ranks'
        mean is the micro-batch's), whose backward gives the gradient of the micro-batch's mean."""
        out: torch.Tensor = _VocabularyLoss.apply(hidden, self._my_targets(targets), self)  # type: ignore[no-untyped-call]
        return out

    def _my_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """This rank's share of a micro-batch's targets (b, s): all, or its shard of the sequence."""
        return targets.tensor_split(self.sequence_shards, dim=1)[self.sequence_shard]

    # ---- the passes (every rank runs each, the root from its schedule)

    def _local(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row of each token in this rank's shard, clamped; whether this rank holds it)."""
        local = ids - self.rows.start
        held = (local >= 0) & (local < len(self.rows))
        return local.clamp(0, len(self.rows) - 1), held

    @torch.no_grad()
    def _embedding_forward(self, ids: torch.Tensor) -> torch.Tensor:
        local, held = self._local(ids)
        out = F.embedding(local, self.shards.embedding).to(self.compute_dtype) * held[..., None]
        dist.reduce(out, dst=self.groups.first_rank, group=self.groups.embedding_forward)
        return out

    @torch.no_grad()
    def _embedding_backward(self, ids: torch.Tensor, grad: torch.Tensor | None) -> None:
        weight = self.shards.embedding
        if grad is None:
            grad = torch.empty(*ids.shape, weight.shape[1], dtype=self.compute_dtype, device=weight.device)
        dist.broadcast(grad, src=self.groups.first_rank, group=self.groups.embedding_backward)
        local, held = self._local(ids)
        assert self._embedding_grad is not None
        # the other ranks' tokens add zeros (at a clamped row): shapes known without the ids' values
        rows = (grad * held[..., None]).flatten(0, -2).to(weight.dtype)
        self._embedding_grad.index_add_(0, local.flatten(), rows, alpha=self._scale)

    @torch.no_grad()
    def _output_pass(self, hidden: torch.Tensor | None, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the micro-batch's mean loss, the summed dX in fp32): both meaningful on the last stage."""
        weight, group = self.shards.output.to(self.compute_dtype), self.groups.output
        if hidden is None:
            hidden = torch.empty(*targets.shape, weight.shape[1], dtype=self.compute_dtype, device=weight.device)
        dist.broadcast(hidden, src=self.groups.last_rank, group=group)
        x = hidden.flatten(0, 1)  # (n, h)
        local, held = self._local(targets.flatten())
        logits = (x @ weight.T).float()  # (n, V/p): as loss_fn casts the logits
        target_logit = torch.where(held, logits.gather(1, local[:, None]).squeeze(1), 0.0)
        n = x.shape[0] * self.sequence_shards  # tokens of the micro-batch: the loss's mean is over all of them
        if self.layout.vocabulary_layout is VocabularyLayout.VOCAB_1:
            # Algorithm 1: statistics, then the gradient of the logits, then dX (2nd barrier)
            maximum = logits.max(dim=1).values
            dist.all_reduce(maximum, op=dist.ReduceOp.MAX, group=group)
            probs = logits.sub_(maximum[:, None]).exp_()  # in place: the logits are not needed again
            stats = torch.stack((probs.sum(dim=1), target_logit))
            dist.all_reduce(stats, group=group)
            total, target = stats
            probs.div_(total[:, None])
            grad_logits = _minus_onehot(probs, local, held).div_(n).to(weight.dtype)
            dx = (grad_logits @ weight).float()
        else:
            # Algorithm 2: dX of the locally normalised softmax before the statistics' reduction,
            # rescaled by each token's share of the global sum of exp after it
            local_max = logits.max(dim=1).values
            probs = logits.sub_(local_max[:, None]).exp_()
            local_sum = probs.sum(dim=1)
            probs.div_(local_sum[:, None])
            dx_local = (probs.to(weight.dtype) @ weight).float()
            dx_target = torch.where(held[:, None], weight[local].float(), 0.0)
            maximum = local_max.clone()
            dist.all_reduce(maximum, op=dist.ReduceOp.MAX, group=group)
            rescaled = local_sum * (local_max - maximum).exp()
            stats = torch.stack((rescaled, target_logit))
            dist.all_reduce(stats, group=group)
            total, target = stats
            share = rescaled / total
            dx = (dx_local * share[:, None] - dx_target).div_(n)
            probs.mul_(share[:, None])
            grad_logits = _minus_onehot(probs, local, held).div_(n).to(weight.dtype)
        assert self._output_grad is not None
        if self._output_grad.dtype == weight.dtype:
            self._output_grad.addmm_(grad_logits.T, x, alpha=self._scale)
        else:  # fp32 shards under ZeRO-2/3
            self._output_grad.add_(grad_logits.T @ x, alpha=self._scale)
        dist.reduce(dx, dst=self.groups.last_rank, group=group)
        loss = (total.log() + maximum - target).mean()
        return loss, dx.view(*targets.shape, -1)


def _minus_onehot(probs: torch.Tensor, local: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``probs`` (n, V/p) minus 1 at each token's target row where this rank holds it (in place;
    0 is subtracted at the clamped row of the others, so no shape depends on the ids' values)."""
    return probs.scatter_add_(1, local[:, None], -held[:, None].to(probs.dtype))


class _EmbedTokens(torch.autograd.Function):
    """The first stage's side of the embedding passes. The weight is an input only so that the
    output requires a gradient; its gradient is accumulated by the pass itself."""

    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor, vp: VocabularyParallel) -> torch.Tensor:
        ctx.vp, ctx.ids = vp, ids
        return vp._embedding_forward(ids)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.vp._embedding_backward(ctx.ids, grad.contiguous())
        return None, None, None


class _VocabularyLoss(torch.autograd.Function):
    """The last stage's side of the output pass: the loss forward, the summed dX backward. The
    pass computes the gradient for a loss whose own gradient is 1 (the schedule's backward)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, targets: torch.Tensor, vp: VocabularyParallel) -> torch.Tensor:
        loss, dx = vp._output_pass(hidden.detach().contiguous(), targets)
        ctx.dx, ctx.dtype = dx, hidden.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if not is_fake(grad_loss) and float(grad_loss) != 1.0:  # a dry run's fake tensors hold no value
            raise RuntimeError("the vocabulary-parallel loss computes its gradients for a backward seeded with 1")
        dx: torch.Tensor = ctx.dx.to(ctx.dtype)
        ctx.dx = None
        return dx, None, None
