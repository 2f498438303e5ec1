"""Tensor and sequence parallelism of a model chunk (Megatron-LM's split).

q/k/v and gate/up are split column-wise, o and down row-wise, through DTensor (multi-head latent
attention's up-projections by heads, its down-projections whole: ``split_latent_attention``); the embedding is
split by vocabulary, the output layer column-wise with a vocabulary-parallel loss (torch's
``loss_parallel``). With sequence parallelism the norms and the residual stream hold 1/t of the
sequence, gathered before attention and the MLP and reduce-scattered after them (Korthikanti et
al. 2022, sec. 4.2.2); the projections after each gather keep only this rank's 1/t of their
input and gather it again in the backward, as Megatron-LM does (``keep_sequence_shards``). A
chunk whose embedding and output layer are split over the pipeline instead
(``runtime.vocabulary_parallel``) splits its embedded tokens and returns its shard.

A mixture-of-experts MLP splits every expert over the group as the dense MLP is split
(expert-tensor parallelism equal to tp, as Megatron-LM's ``expert_tensor_parallel_size``
defaults to the tensor-parallel size, and as the cost model prices it): each rank holds 1/t of
every expert's columns of gate/up and rows of down (``split_expert``: slices of the reference's
matrices, a bias of down on the first rank only). The router and the top-k stay whole and
identical on every rank, which routes the same tokens (the whole sequence under sequence
parallelism) and computes, for each of its routed (token, expert) pairs, its partial expert
output; the combine (gate weights times outputs, summed per token) is linear, so the partial
sums are reduced once per layer after it (``ExpertRegion``: Megatron's f and g operators
around the whole layer, not per expert).

Backward: the input's gradient is partial on each rank (every path into it, experts and router,
goes through the partial outputs), so the region's entry all-reduces it (reduce-scatters it
under sequence parallelism), once per layer. The router's weight gradient is partial too: the
gate weights multiply the partial outputs, so d loss / d weight is each rank's share. Rather
than reduce the k per-pair outputs before weighting them (k times the bytes of the layer's
output), each rank keeps its partial router gradient and ``PartialGradients`` sums it over the
group once per step before the update, as Megatron-LM's ``finalize_model_grads`` sums the
sequence-parallel norms' gradients over the tensor-parallel group. With expert parallelism
(``runtime.expert_parallel``) the exchange runs inside the region among the ranks of one tp
coordinate: tokens go out whole, partial outputs come back and are reduced after the combine.

An MoE layer's shared experts (``runtime.mlp.SharedExpert``) are split as the dense MLP is, in
and out of their own sequence-parallel region, folded experts or not (the cost model keeps a
dense MLP's collectives for them). Qwen2-MoE's sigmoid gate stays whole: each rank scales its own
columns, so the gate's input gradient is summed over the group in the backward
(``_partial_gradient``) and its weight's, as Qwen3's q/k norms' (each rank normalizes its own
heads), by ``PartialGradients`` with the routers'.

With the experts folded (``Layout.folds_experts``: expert tensor parallelism 1, Megatron-Core's
MoE parallel folding) nothing of an MoE layer is split here: every expert stays whole on the
ranks that hold it, and each rank's layer takes its own (b, s/t, h) shard of the sequence-parallel
norm's output, routes it with its whole router and returns the (b, s/t, h) output of those
tokens, which joins the sequence-parallel residual stream as it is: no region, no gather of the
sequence, no reduction of expert outputs. The token exchange runs over the folded expert-parallel
group (``runtime.expert_parallel``). The router's gradient on each rank covers only the tokens it
routed, and the tensor-parallel ranks of a replica route disjoint shares of its sequence whose
gradients add up to the replica's: ``PartialGradients`` sums them as it sums the partial ones.
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from planner.schemas.errors import InfeasibleConfigError
from runtime.latent_attention import LatentAttention
from runtime.mlp import MLP, MoE, SharedExpert
from runtime.model import Attention, Decoder
from runtime.optim import flat_apply, local, local_grad
from runtime.torch_compat import all_gather_single, reduce_scatter_single


def tensor_parallel(
    chunk: Decoder, tp_mesh: DeviceMesh, *, sequence_parallel: bool, fold_experts: bool = False
) -> None:
    """Split ``chunk``'s parameters over ``tp_mesh`` in place (see the module's docstring).

    Args:
        chunk: a model chunk; whichever of embedding, layers and output layer it holds is split.
        tp_mesh: the 1-D mesh of this rank's tensor-parallel group.
        sequence_parallel: also split the norms' and the residual stream's sequence.
        fold_experts: keep every expert whole and let each rank's MoE layers take its own
            sequence shard (``Layout.folds_experts``; needs ``sequence_parallel``).
    """
    if fold_experts and not sequence_parallel:
        raise InfeasibleConfigError(
            "expert_tensor_parallel_degree=1 needs sequence_parallel (each rank routes its own share of the "
            "sequence); turn it on"
        )
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    rank, degree = tp_mesh.get_local_rank(), tp_mesh.size()
    for i, block in chunk.layers.items():
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        if isinstance(block.attn, LatentAttention):
            split_latent_attention(block.attn, tp_mesh)
        else:
            plan |= {f"layers.{i}.attn.{n}": ColwiseParallel() for n in ("q", "k", "v")}
        plan[f"layers.{i}.attn.o"] = RowwiseParallel(output_layouts=seq)
        for name, mlp in (("mlp", block.mlp), ("shared_expert", block.shared_expert)):
            if isinstance(mlp, MLP):  # a dense MLP, or shared experts: split as a dense MLP
                plan |= _mlp_plan(f"layers.{i}.{name}", mlp, seq, gather if sequence_parallel else None)
        if isinstance(block.shared_expert, SharedExpert) and block.shared_expert.sigmoid_gate is not None:
            block.shared_expert.gate_input = partial(_partial_gradient, mesh=tp_mesh)
        if isinstance(block.mlp, MoE) and fold_experts:
            block.mlp.register_forward_pre_hook(_sequence_shard)
        elif isinstance(block.mlp, MoE):
            for expert in block.mlp.experts.values():
                assert isinstance(expert, MLP)
                split_expert(expert, rank, degree)
            ExpertRegion(tp_mesh.get_group(), sequence_parallel=sequence_parallel).wrap(block.mlp)
        if sequence_parallel:
            plan |= {f"layers.{i}.{n}": SequenceParallel() for n in ("norm1", "norm2")}
            plan[f"layers.{i}.attn"] = gather
            keep_sequence_shards(cast(nn.Module, block.attn), block)
            for mlp in (block.mlp, block.shared_expert):
                if isinstance(mlp, MLP):
                    keep_sequence_shards(mlp, block)
    if chunk.takes_tokens and sequence_parallel:
        chunk.to_sequence_shards = partial(_scatter_sequence, mesh=tp_mesh)
    if chunk.norm is not None and sequence_parallel:
        # without the output layer (split over the pipeline), the chunk returns its sequence shard
        plan["norm"] = SequenceParallel(use_local_output=chunk.head is None)
    if chunk.head is not None:
        plan["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        if sequence_parallel:
            keep_sequence_shards(chunk.head)
    tied = chunk.tok_emb is not None and chunk.head is not None and chunk.head.weight is chunk.tok_emb.weight
    parallelize_module(chunk, tp_mesh, plan)  # type: ignore[arg-type]
    if chunk.tok_emb is not None:
        VocabularyLookup(chunk.tok_emb, tp_mesh).split()
    if tied:  # parallelizing each module replaced the shared parameter by two DTensors
        assert chunk.head is not None and chunk.tok_emb is not None
        chunk.head.weight = chunk.tok_emb.weight


def split_latent_attention(attn: LatentAttention, mesh: DeviceMesh) -> None:
    """Split multi-head latent attention's per-head up-projections (q_b or q, kv_b) by rows over
    ``mesh`` (DTensors: each rank's heads, the reference's values) and make the module one
    tensor-parallel region (``runtime.latent_attention``): its input, whole on every rank (a plain
    tensor, or a replicated DTensor under sequence parallelism), enters as a plain tensor whose
    gradient is each rank's share, summed over the group in the backward (reduce-scattered with
    sequence parallelism). o is split row-wise by the caller's plan, its partial outputs reduced
    on the way out. The down-projections and their norms stay whole; ``PartialGradients`` sums
    their gradients."""
    for linear in attn.per_head().values():
        linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, [Shard(0)]))
    original = attn.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = original(_partial_gradient(x, mesh=mesh))
        return out

    attn.forward = forward  # type: ignore[method-assign]


def _mlp_plan(prefix: str, mlp: MLP, seq: Shard | Replicate, gather: PrepareModuleInput | None) -> dict[str, object]:
    """Megatron's split of an MLP at ``prefix``: gate and up column-wise, down row-wise (its output
    ``seq``), its input gathered over the sequence under sequence parallelism (``gather``)."""
    plan: dict[str, object] = {
        f"{prefix}.{n}": ColwiseParallel() for n in ("gate", "up") if getattr(mlp, n) is not None
    }
    plan[f"{prefix}.down"] = RowwiseParallel(output_layouts=seq)
    if gather is not None:
        plan[prefix] = gather
    return plan


def _partial_gradient(x: torch.Tensor, *, mesh: DeviceMesh) -> torch.Tensor:
    """``x``, whole on every rank of ``mesh`` (a plain tensor, or a replicated DTensor under
    sequence parallelism), as a plain tensor whose gradient is partial on each rank and summed
    over the group in the backward: the shared expert's gate feeds each rank's own columns."""
    whole = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return whole.to_local(grad_placements=[Partial()])


def keep_sequence_shards(module: nn.Module, block: nn.Module | None = None) -> None:
    """Make ``module``, whose input arrives all-gathered over the sequence (a sequence-parallel
    region's column-parallel projections), keep only this rank's 1/t of that input for its
    backward and gather it again there: Megatron-LM's sequence parallelism (Korthikanti et al.
    2022, sec. 4.2.2), which DTensor's does not do (its Linears keep the gathered (b, s, h)).
    Its parameters keep their names (the forward is wrapped, not the module). Not under full
    recompute (``block.recompute_all``), nor in an MLP whose block recomputes it
    (``block.recompute_mlp``), where the block keeps nothing of it anyway (and a checkpoint saves
    what its region saves itself)."""
    original = module.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        feed_forward = module is getattr(block, "mlp", None) or module is getattr(block, "shared_expert", None)
        checkpointed = getattr(block, "recompute_all", False) or (
            feed_forward and getattr(block, "recompute_mlp", False)
        )
        if not isinstance(x, DTensor) or checkpointed:
            return original(x, *args, **kwargs)
        shard = _SequenceShard(x)
        try:
            with torch.autograd.graph.saved_tensors_hooks(shard.pack, shard.unpack):
                return original(x, *args, **kwargs)
        finally:
            shard.gathered = None  # the saved shard must not keep the gathered input alive

    module.forward = forward


class _SequenceShard:
    """Saved-tensor hooks that store a gathered DTensor (and its views, as a Linear saves its
    flattened input) as this rank's clone of its sequence shard, gathered again when unpacked."""

    def __init__(self, gathered: DTensor) -> None:
        self.gathered: DTensor | None = gathered
        self.shard: torch.Tensor | None = None
        self.full: DTensor | None = None
        self.mesh, self.shape, self.stride = gathered.device_mesh, gathered.shape, gathered.stride()

    def pack(self, t: torch.Tensor) -> Any:
        if self.gathered is None:
            return t
        plain = not isinstance(t, DTensor)
        if not (t is self.gathered or t._base is self.gathered or (plain and self._holds(t))):
            return t
        if self.shard is None:
            local = self.gathered.to_local()
            self.shard = local.chunk(self.mesh.size(), dim=1)[self.mesh.get_local_rank()].clone()
        return (self, t.shape, plain)

    def _holds(self, t: torch.Tensor) -> bool:
        """Whether plain ``t`` is the gathered input's own local tensor, whole: a view of it that a
        region computing on plain tensors (``split_latent_attention``) saves, or a flattened one."""
        assert isinstance(self.gathered, DTensor)
        root = self.gathered._local_tensor
        root = root if root._base is None else root._base
        return (t if t._base is None else t._base) is root and t.numel() == root.numel() and t.is_contiguous()

    def unpack(self, packed: Any) -> torch.Tensor:
        if not (isinstance(packed, tuple) and len(packed) == 3 and packed[0] is self):
            result: torch.Tensor = packed
            return result
        if self.full is None:
            assert self.shard is not None
            sharded = DTensor.from_local(
                self.shard, self.mesh, [Shard(1)], run_check=False, shape=self.shape, stride=self.stride
            )
            self.full = sharded.redistribute(self.mesh, [Replicate()])
        full: torch.Tensor = self.full.to_local() if packed[2] else self.full
        return full.reshape(packed[1])


def split_expert(expert: MLP, rank: int, degree: int) -> None:
    """Keep, in place, tensor-parallel rank ``rank``'s part of an expert out of ``degree``: the
    rank's contiguous 1/degree of the intermediate width, the rows of gate and up and the
    columns of down (Megatron's column- then row-parallel MLP), sliced from the whole matrices
    so that they hold the reference's values; down's bias, added once to the reduced output,
    stays on rank 0 only. Works on meta tensors (shapes only).

    Raises:
        InfeasibleConfigError: ``degree`` does not divide the expert's width.
    """
    width = expert.up.out_features
    if width % degree:
        raise InfeasibleConfigError(f"tp={degree} does not divide the experts' width {width}; use a tp that divides it")
    part = slice(rank * width // degree, (rank + 1) * width // degree)
    for linear in (expert.gate, expert.up):
        if linear is not None:
            linear.weight = nn.Parameter(linear.weight.detach()[part].clone())
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias.detach()[part].clone())
            linear.out_features = width // degree
    expert.down.weight = nn.Parameter(expert.down.weight.detach()[:, part].clone())
    expert.down.in_features = width // degree
    if rank != 0 and expert.down.bias is not None:
        expert.down.register_parameter("bias", None)


def _sequence_shard(module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor]:
    """A folded MoE layer's input: this rank's (b, s/t, h) shard of the sequence-parallel norm's
    output, as a plain tensor (its backward returns the shard's gradient to the norm)."""
    x = args[0]
    return (x.to_local() if isinstance(x, DTensor) else x,)


class ExpertRegion:
    """An MoE layer as one tensor-parallel region over ``group``: on the way in the tokens (f:
    identity forward, all-reduce backward; under sequence parallelism all-gather of the sequence
    forward, reduce-scatter backward), on the way out the partial outputs (g: all-reduce
    forward, identity backward; under sequence parallelism reduce-scatter forward, all-gather
    backward). The layer takes and returns plain (b, s, h) tensors: the whole sequence without
    sequence parallelism, this rank's 1/t of it with."""

    def __init__(self, group: dist.ProcessGroup, *, sequence_parallel: bool) -> None:
        self.group, self.sequence_parallel = group, sequence_parallel

    def wrap(self, moe: MoE) -> None:
        """Make ``moe``'s forward run inside the region (hooks: its parameters keep their names)."""
        moe.register_forward_pre_hook(self._enter)
        moe.register_forward_hook(self._leave)

    def _enter(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor]:
        x = args[0]
        if isinstance(x, DTensor):  # a sequence-parallel norm's output: this rank's shard
            x = x.to_local()
        out: torch.Tensor = _Enter.apply(x, self.group, self.sequence_parallel)  # type: ignore[no-untyped-call]
        return (out,)

    def _leave(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Leave.apply(output, self.group, self.sequence_parallel)  # type: ignore[no-untyped-call]
        return out


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out = x.contiguous().clone()
    if not out.is_meta:  # a pipeline stage's shape inference runs on meta tensors
        dist.all_reduce(out, group=group)
    return out


def _gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, s/t, h) shards of the group to (b, s, h), in rank order."""
    shard = x.transpose(0, 1).contiguous()
    out = shard.new_empty((shard.shape[0] * dist.get_world_size(group), *shard.shape[1:]))
    if not out.is_meta:
        all_gather_single(out, shard, group=group)
    return out.transpose(0, 1)


def _reduce_scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, s, h) partial sums to this rank's (b, s/t, h) slice of their sum."""
    whole = x.transpose(0, 1).contiguous()
    out = whole.new_empty((whole.shape[0] // dist.get_world_size(group), *whole.shape[1:]))
    if not out.is_meta:
        reduce_scatter_single(out, whole, group=group)
    return out.transpose(0, 1)


class _Enter(torch.autograd.Function):
    """Into the region: identity (or all-gather of the sequence); backward all-reduce (or
    reduce-scatter) of the partial input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, sequence: bool) -> torch.Tensor:
        ctx.group, ctx.sequence = group, sequence
        return _gather_sequence(x, group) if sequence else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        reduce = _reduce_scatter_sequence if ctx.sequence else _all_reduce
        return reduce(grad, ctx.group), None, None


class _Leave(torch.autograd.Function):
    """Out of the region: all-reduce (or reduce-scatter along the sequence) of the partial
    outputs; backward identity (or all-gather of the sequence)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, sequence: bool) -> torch.Tensor:
        ctx.group, ctx.sequence = group, sequence
        return _reduce_scatter_sequence(x, group) if sequence else _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (_gather_sequence(grad, ctx.group) if ctx.sequence else grad), None, None


class VocabularyLookup:
    """The vocabulary-parallel embedding's lookup, as Megatron-LM's ``VocabParallelEmbedding``: each
    rank looks up the tokens of its rows, zeroes the others, and the group all-reduces the sum.

    DTensor's own row-wise embedding (``RowwiseParallel``) looks up alike but has no row-wise
    backward strategy: it computes the whole (V, h) weight gradient as a partial sum on every rank
    and reduce-scatters it, every micro-batch. On the dry run of Llama 3 70B at tp 8 that held two
    whole-vocabulary (V, h) tensors, 2 GiB each, at the first stage's peak, beyond the estimate.
    Here the lookup runs on the local shard, whose backward is the shard's gradient alone; the
    forward's all-reduce has an identity backward. The weight is a DTensor (Shard(0)), laid out
    as ``Shard`` splits a tensor (``torch.chunk``: ceil(V/t) rows per rank, the last ranks'
    fewer), as the tied output layer's (``ColwiseParallel``) is."""

    def __init__(self, embedding: nn.Embedding, mesh: DeviceMesh) -> None:
        self.embedding, self.mesh, self.group = embedding, mesh, mesh.get_group()
        rows = -(-embedding.num_embeddings // mesh.size())
        self.first_row = rows * mesh.get_local_rank()

    def split(self) -> None:
        """Keep this rank's rows of the weight and look up through ``lookup``."""
        emb = self.embedding
        emb.weight = nn.Parameter(distribute_tensor(emb.weight, self.mesh, [Shard(0)]))
        emb.forward = self.lookup  # type: ignore[method-assign,assignment]

    def lookup(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (b, s), whole on every rank, to their embeddings (b, s, h), whole."""
        shard = local(self.embedding.weight)
        outside = (tokens < self.first_row) | (tokens >= self.first_row + shard.shape[0])
        ids = torch.where(outside, 0, tokens - self.first_row)
        partial_sum = nn.functional.embedding(ids, shard).masked_fill(outside.unsqueeze(-1), 0.0)
        out: torch.Tensor = _Leave.apply(partial_sum, self.group, False)  # type: ignore[no-untyped-call]
        return out


class PartialGradients:
    """Sums over the tensor-parallel group, in one flat all-reduce per step before the
    optimizer's own reduction, the partial gradients of the weights every rank holds whole: the
    routers' (see the module's docstring), the shared experts' sigmoid gates' (each rank's gate
    scales its own columns), Qwen3's q/k norms' (each rank normalizes its own heads) and multi-head
    latent attention's down-projections and their norms' (each rank's heads read them). Every
    rank then holds their whole gradients and takes the same update."""

    def __init__(self, chunks: Sequence[nn.Module], group: dist.ProcessGroup) -> None:
        self.group = group
        whole: list[nn.Module | None] = []
        for chunk in chunks:
            for m in chunk.modules():
                if isinstance(m, MoE):
                    whole.append(m.router)
                elif isinstance(m, SharedExpert):
                    whole.append(m.sigmoid_gate)
                elif isinstance(m, Attention):
                    whole += [m.q_norm, m.k_norm]
                elif isinstance(m, LatentAttention):
                    whole += m.replicated()
        self.params = [p for module in whole if module is not None for p in module.parameters()]

    def zero_grad(self) -> None:
        """Nothing: the dense optimizer drops these gradients."""

    def step(self) -> None:
        """Sum each weight's gradient over the group."""
        grads = [g for g in map(local_grad, self.params) if g is not None]
        flat_apply(grads, partial(dist.all_reduce, group=self.group))


def loss_context(tensor_parallel_degree: int) -> AbstractContextManager[None]:
    """Where the loss and its backward run: the vocabulary-parallel loss when the output layer is
    split (tensor_parallel_degree > 1), else nothing."""
    return loss_parallel() if tensor_parallel_degree > 1 else nullcontext()


def _scatter_sequence(h: torch.Tensor, *, mesh: DeviceMesh) -> torch.Tensor:
    """A replicated (b, s, h) activation to this rank's slice of the sequence; the backward
    all-gathers the gradient, so replicated parameters before it (positions) get it whole."""
    return DTensor.from_local(h, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local()
