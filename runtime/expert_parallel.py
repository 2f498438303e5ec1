"""Expert parallelism: each expert-parallel rank holds some experts of every MoE layer, and tokens
travel to the ranks holding their experts and back (GShard, Lepikhin et al. 2020; the dispatch /
combine of Megatron-LM's ``MoEAlltoAllTokenDispatcher``).

An expert-parallel group is ep consecutive data-parallel replicas (``schemas.geometry``'s
(edp, ep) split of the data axis, ``runtime.mesh.expert_mesh``). Which experts a rank holds is a
placement table: for each MoE layer, the expert ids each expert-parallel rank hosts. Per layer and
micro-batch, each rank sends each routed (token, expert) pair to the expert's rank with one
all-to-all of variable splits, runs its experts on what it received, and returns the outputs with
a second all-to-all; the backward runs the same exchanges in reverse. Dropless: every routed token
is served.

Under tensor parallelism the group is the ranks of one tensor-parallel coordinate, whose experts
are all that coordinate's part (``runtime.tensor_parallel``): tokens travel whole (h wide), the
experts' partial outputs come back, and the layer's tensor-parallel region sums them after the
combine. With the experts folded (``Layout.folds_experts``, expert tensor parallelism 1 under
sequence parallelism) the group is instead ep consecutive ranks of the stage's d t (replica and
tensor shard mixed, ``schemas.geometry.expert_rank_of``): each rank sends the pairs of its own
s/t tokens, every expert is whole, and its output needs no reduction.

An expert the table lists on several ranks is replicated (as DeepSeek's EPLB places redundant
experts): its copies share its pairs (``ExpertExchange``) and sum their gradients
(``ReplicaGradients``).

Gradients: an expert's gradient on its rank sums the contributions of its whole expert-parallel
group, so experts are summed over the expert-data-parallel group (same place, other groups) and
divided by d, as dense parameters are averaged over all d replicas (``runtime.data_parallel``).
The divisor stays d when the experts are folded, although the group then has d t / ep ranks: the
step's loss is the mean of the d replicas' losses, L = (1/d) sum_r L_r, and every tensor-parallel
rank of replica r back-propagates the whole L_r (the vocabulary-parallel loss) into its own s/t
tokens, which no other rank routes. A token's pairs reach an expert once, from the one rank that
routed it, so the sum over the edp group of the experts' local gradients is
sum_r sum_j dL_r/dW|tokens of shard j = sum_r dL_r/dW = d dL/dW, and dividing by d gives dL/dW.
(Dividing by the group's size d t / ep, as a mean would, scales the update by ep / t.)
"""

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.schemas import Layout, ModelSpec
from planner.schemas.errors import InfeasibleConfigError
from runtime.mlp import MLP, MoE, add_rows, moe_layers
from runtime.model import Decoder
from runtime.optim import DataParallelOptimizer
from runtime.tensor_parallel import PartialGradients, split_expert

PlacementTable = tuple[tuple[tuple[int, ...], ...], ...]
"""For each MoE layer in model order, the expert ids each expert-parallel rank hosts."""


def placement_table(model: ModelSpec, layout: Layout) -> PlacementTable:
    """The layout's placement as a table: ``layout.expert_placement.slots`` (the plan's, replicas
    included), or contiguous blocks (expert e on rank e // (E / ep)) in every MoE layer."""
    if layout.expert_placement is not None:
        return layout.expert_placement.slots
    ep, num_experts = layout.expert_parallel_degree, model.num_local_experts
    ranks = tuple(e * ep // num_experts for e in range(num_experts))
    hosts = tuple(tuple(e for e, r in enumerate(ranks) if r == q) for q in range(ep))
    return tuple(hosts for _ in moe_layers(model))


def check_placement(model: ModelSpec, layout: Layout, table: PlacementTable) -> None:
    """Refuse a table the runtime cannot run: one row per MoE layer, one entry per
    expert-parallel rank, each layer's experts hosted at least once and at most once per rank
    (an expert on several ranks is replicated). The layout itself is checked before, by
    ``schemas.layout.check_experts`` (ep divides the experts of a model that has them).

    Raises:
        InfeasibleConfigError: naming the layer, the value and the fix.
    """
    ep, num_experts = layout.expert_parallel_degree, model.num_local_experts
    layers = moe_layers(model)
    if len(table) != len(layers):
        raise InfeasibleConfigError(
            f"the expert placement has {len(table)} layer(s); {model.name!r} has {len(layers)} MoE layers: "
            "give one row per MoE layer"
        )
    for layer, hosts in zip(layers, table, strict=True):
        hosted = {e for rank in hosts for e in rank}
        if len(hosts) != ep or hosted != set(range(num_experts)) or any(len(set(r)) != len(r) for r in hosts):
            raise InfeasibleConfigError(
                f"the expert placement of layer {layer} is {[list(r) for r in hosts]}: it must give each of the "
                f"ep={ep} ranks its experts, hosting each of the {num_experts} experts at least once and no "
                "expert twice on one rank"
            )


def hosted_experts(model: ModelSpec, table: PlacementTable, place: int) -> dict[int, tuple[int, ...]]:
    """The experts expert-parallel rank ``place`` holds, by model layer."""
    return {layer: hosts[place] for layer, hosts in zip(moe_layers(model), table, strict=True)}


class Traffic:
    """Bytes this rank's all-to-alls sent to the other ranks of their group (its own rows left out)."""

    def __init__(self) -> None:
        self.sent_bytes = 0

    def count(self, rows: torch.Tensor, splits: list[int], place: int) -> None:
        row_bytes = rows[0].numel() * rows.element_size() if len(rows) else 0
        self.sent_bytes += (sum(splits) - splits[place]) * row_bytes


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with variable splits whose backward is the reverse exchange."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send: list[int], receive: list[int], group: dist.ProcessGroup, traffic: Traffic
    ) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group, ctx.traffic = send, receive, group, traffic
        out = x.new_empty((sum(receive), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), receive, send, group=group)
        traffic.count(x, send, dist.get_rank(group))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.receive, group=ctx.group)
        ctx.traffic.count(grad, ctx.receive, dist.get_rank(ctx.group))
        return out, None, None, None, None


def all_to_all(
    x: torch.Tensor, send: list[int], receive: list[int], group: dist.ProcessGroup, traffic: Traffic
) -> torch.Tensor:
    """Rows of ``x`` split by ``send`` to each rank of ``group``; rows from each by ``receive``;
    ``traffic`` counts what the exchange and its backward send to other ranks."""
    out: torch.Tensor = _AllToAll.apply(x, send, receive, group, traffic)  # type: ignore[no-untyped-call]
    return out


class ExpertExchange:
    """The dispatch of one MoE layer over its expert-parallel group (a ``runtime.model.Dispatch``).

    Routed pairs are sorted by their expert's slot, the experts listed rank by rank as the table
    hosts them, so each rank's share is one contiguous run and, inside it, grouped by expert. A
    replicated expert serves its pairs here when this rank holds a copy, else the copies take
    the pairs in turn (pair i to copy i mod copies).
    ``sent_pairs`` counts routed (token, expert) pairs this rank sent to each rank of its group
    (itself included) over every forward, recomputations too; ``traffic`` the bytes the dispatch
    and the combine, forward and backward, sent to the other ranks.
    """

    def __init__(self, hosts: tuple[tuple[int, ...], ...], group: dist.ProcessGroup) -> None:
        self.group, self.place = group, dist.get_rank(group)
        slots: dict[int, list[int]] = {}  # expert -> its copies' slots, in rank order
        for slot, e in enumerate(e for rank in hosts for e in rank):
            slots.setdefault(e, []).append(slot)
        first_mine = sum(len(rank) for rank in hosts[: self.place])
        mine = {e: first_mine + i for i, e in enumerate(hosts[self.place])}
        copies = max(len(v) for v in slots.values())
        # slot of pair i routed to expert e: column i mod copies[e]; a copy held here takes all
        self.slots = torch.tensor(
            [
                [mine[e]] * copies if e in mine else [slots[e][i % len(slots[e])] for i in range(copies)]
                for e in range(len(slots))
            ]
        )
        self.copies = torch.tensor([1 if e in mine else len(slots[e]) for e in range(len(slots))])
        self.per_rank = [len(rank) for rank in hosts]
        self.mine = hosts[self.place]
        self.sent_pairs = [0] * len(hosts)
        self.traffic = Traffic()

    def __call__(
        self, experts: nn.ModuleDict, tokens: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        k, ep = expert_ids.shape[1], len(self.per_rank)
        ids = expert_ids.reshape(-1)
        turn = torch.arange(len(ids), device=ids.device) % self.copies.to(ids.device)[ids]
        slots = self.slots.to(ids.device)[ids, turn]
        order = torch.argsort(slots, stable=True)
        token = order // k
        # 1. how many pairs go to each expert: each rank learns its experts' counts from every rank
        counts = torch.bincount(slots, minlength=sum(self.per_rank))
        incoming = counts.new_empty(len(self.mine) * ep)
        dist.all_to_all_single(incoming, counts, [len(self.mine)] * ep, self.per_rank, group=self.group)
        send = [int(part.sum()) for part in torch.split(counts, self.per_rank)]
        receive = incoming.view(ep, len(self.mine)).sum(dim=1).tolist()
        self.sent_pairs = [total + n for total, n in zip(self.sent_pairs, send, strict=True)]
        # 2. dispatch, run the experts held here, combine
        received = all_to_all(tokens[token], send, receive, self.group, self.traffic)
        local = torch.arange(len(self.mine), device=tokens.device).repeat(ep).repeat_interleave(incoming)
        outputs = torch.zeros_like(received)
        for i, e in enumerate(self.mine):
            rows = (local == i).nonzero().squeeze(1)
            outputs = add_rows(outputs, rows, experts[str(e)](received[rows]))
        back = all_to_all(outputs, receive, send, self.group, self.traffic)
        weight = weights.reshape(-1)[order]
        return add_rows(torch.zeros_like(tokens), token, back * weight[:, None])


def expert_parallel(chunk: Decoder, model: ModelSpec, table: PlacementTable, ep_group: dist.ProcessGroup) -> None:
    """Make ``chunk``'s MoE layers exchange tokens over ``ep_group`` as ``table`` places experts."""
    hosts = dict(zip(moe_layers(model), table, strict=True))
    for name, block in chunk.layers.items():
        if isinstance(block.mlp, MoE):
            block.mlp.dispatch = ExpertExchange(hosts[int(name)], ep_group)


def expert_sent_bytes(chunks: Iterable[nn.Module]) -> int:
    """Bytes the MoE layers of ``chunks`` have sent to other expert-parallel ranks so far (0
    without expert parallelism): every dispatch and combine, forward and backward."""
    return sum(
        m.dispatch.traffic.sent_bytes
        for chunk in chunks
        for m in chunk.modules()
        if isinstance(m, MoE) and isinstance(m.dispatch, ExpertExchange)
    )


def expert_parameters(chunks: Iterable[nn.Module]) -> list[nn.Parameter]:
    """The experts' parameters of ``chunks``, in order (the router is a dense parameter)."""
    return [p for chunk in chunks for m in chunk.modules() if isinstance(m, MoE) for p in m.experts.parameters()]


class ReplicaGradients:
    """Sums the gradients of replicated experts over their copies in the expert-parallel group,
    before the expert-data-parallel reduction: every copy then holds the whole expert's gradient
    and takes the same update. One all-reduce over the group of every replicated expert's
    gradients (zeros where this rank holds no copy): replicas are few (EPLB's redundant experts).
    """

    def __init__(
        self,
        chunks: Sequence[Decoder],
        model: ModelSpec,
        table: PlacementTable,
        ep_group: dist.ProcessGroup,
        *,
        tensor_rank: int = 0,
        tensor_degree: int = 1,
    ) -> None:
        """``tensor_rank`` of ``tensor_degree``: this rank's tensor-parallel part of each expert
        (``runtime.tensor_parallel.split_expert``), which the whole expert-parallel group shares."""
        self.group = ep_group
        with torch.device("meta"):
            expert = MLP(model, model.expert_ffn_size)
            if tensor_degree > 1:
                split_expert(expert, tensor_rank, tensor_degree)
            self.shapes = [p.shape for p in expert.parameters()]
        some = next(p for chunk in chunks for p in chunk.parameters())
        self.dtype, self.device = some.dtype, some.device
        moe = {int(i): b.mlp for c in chunks for i, b in c.layers.items() if isinstance(b.mlp, MoE)}
        self.copies: list[list[nn.Parameter] | None] = [
            list(moe[layer].experts[str(e)].parameters()) if str(e) in moe[layer].experts else None
            for layer, hosts in zip(moe_layers(model), table, strict=True)
            if layer in moe  # the group's ranks hold the same layers (one pipeline stage)
            for e in range(model.num_local_experts)
            if sum(e in rank for rank in hosts) > 1
        ]

    def zero_grad(self) -> None:
        """Nothing: the experts' optimizer drops their gradients."""

    def step(self) -> None:
        """Sum each replicated expert's gradient over its copies."""
        if not self.copies:
            return
        grads = [
            [p.grad if p.grad is not None else torch.zeros_like(p) for p in params] if params else None
            for params in self.copies
        ]
        flat = torch.cat(
            [
                g.reshape(-1)
                for held in grads
                for g in (held or [torch.zeros(s, dtype=self.dtype, device=self.device) for s in self.shapes])
            ]
        )
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for params in self.copies:
            for i, shape in enumerate(self.shapes):
                if params is not None:
                    params[i].grad = flat[offset : offset + shape.numel()].view(shape).clone()
                offset += shape.numel()


class JointOptimizer:
    """Optimizers of disjoint parameter sets (dense, experts) stepped as one, after any
    reduction (replicated experts' gradients) that must precede them."""

    def __init__(
        self,
        parts: Sequence[
            "DataParallelOptimizer | torch.optim.Optimizer | ReplicaGradients | PartialGradients | JointOptimizer"
        ],
    ) -> None:
        self.parts = list(parts)

    def zero_grad(self) -> None:
        """Drop every gradient."""
        for part in self.parts:
            part.zero_grad()

    def step(self) -> None:
        """Reduce and step each part, in order (every rank steps them in the same order)."""
        for part in self.parts:
            part.step()

    def tracked(self) -> list[torch.optim.Optimizer | torch.Tensor]:
        """What memory tracking must be told of (see ``DataParallelOptimizer.tracked``)."""
        inner: list[torch.optim.Optimizer | torch.Tensor] = []
        for part in self.parts:
            if isinstance(part, DataParallelOptimizer | JointOptimizer):
                inner += part.tracked()
            elif isinstance(part, torch.optim.Optimizer):
                inner.append(part)
        return inner


def replicated(table: PlacementTable) -> bool:
    """Whether some layer of ``table`` hosts an expert on several ranks."""
    return any(len({e for rank in hosts for e in rank}) < sum(map(len, hosts)) for hosts in table)
