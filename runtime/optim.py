"""Optimizers the runtime offers, and the data-parallel optimizer of ZeRO stages 0 and 1.

``DataParallelOptimizer`` averages gradients over the data-parallel group in one flat all-reduce
and steps; with ``shard`` (ZeRO-1, Rajbhandari et al. 2020) each rank keeps optimizer state only
for the parameters it owns and broadcasts their update. With parameters in bf16/fp16 it keeps an
fp32 master copy of the parameters it owns, in the optimizer, as mixed-precision Adam does: 2 + 2
bytes per parameter for weights and gradients, 4 + 8 for master and moments, sharded by ZeRO-1.
"""

from collections.abc import Callable, Iterable
from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """AdamW (no weight decay) or plain SGD (exact parity checks)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor behind a DTensor (the tensor itself otherwise)."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """The rank's gradient laid out as its parameter (a replicated parameter's gradient can be a
    pending partial sum under sequence parallelism; it is reduced first)."""
    g = p.grad
    if g is None:
        return None
    if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
        g = g.redistribute(p.device_mesh, p.placements)
        p.grad = g
    return local(g)


def flat_apply(tensors: list[torch.Tensor], collective: Callable[[torch.Tensor], object]) -> None:
    """Run one collective on the concatenation of ``tensors`` and copy the result back."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    collective(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def _broadcast(flat: torch.Tensor, *, src: int, group: dist.ProcessGroup) -> None:
    dist.broadcast(flat, src=src, group=group)


class DataParallelOptimizer:
    """ZeRO-0 (``shard=False``) or ZeRO-1 (``shard=True``) over ``group``, any parameter precision."""

    def __init__(
        self,
        name: str,
        params: list[torch.nn.Parameter],
        lr: float,
        group: dist.ProcessGroup,
        *,
        shard: bool,
        grad_divisor: int | None = None,
    ) -> None:
        """``grad_divisor``: what the gradients' sum over ``group`` is divided by (default the
        group's size: their mean); experts' sums over their expert-data-parallel group are divided
        by the whole data-parallel degree (``runtime.expert_parallel``)."""
        self.params, self.group = params, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.divisor = self.size if grad_divisor is None else grad_divisor
        parts = self.size if shard else 1
        loads = [0] * parts
        self.owner: list[int] = []
        for p in params:  # greedy balance by size, in a fixed order every rank agrees on
            o = loads.index(min(loads))
            self.owner.append(o)
            loads[o] += p.numel()
        self.shard = shard
        mine = [p for p, o in zip(params, self.owner, strict=True) if not shard or o == self.rank]
        self.mixed = any(p.dtype != torch.float32 for p in params)
        self.masters = {id(p): local(p).detach().float().clone() for p in mine} if self.mixed else {}
        targets = [self.masters[id(p)] for p in mine] if self.mixed else mine
        self.inner = make_optimizer(name, targets, lr) if targets else None
        self.mine = mine

    def zero_grad(self) -> None:
        """Drop every gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Average gradients over the group, step the owned parameters, broadcast their updates."""
        grads = [g for g in (local_grad(p) for p in self.params) if g is not None]
        if self.size > 1:
            flat_apply(grads, lambda flat: (dist.all_reduce(flat, group=self.group), flat.div_(self.divisor)))
        elif self.divisor != 1:
            flat_apply(grads, lambda flat: flat.div_(self.divisor))
        if self.mixed:
            for p in self.mine:
                g = local_grad(p)
                self.masters[id(p)].grad = None if g is None else g.float()
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            if self.mixed:
                for p in self.mine:
                    master = self.masters[id(p)]
                    local(p.data).copy_(master)
                    master.grad = None  # the fp32 gradient lives only for the update
            if self.shard and self.size > 1:
                for owner in range(self.size):
                    owned = [local(p.data) for p, o in zip(self.params, self.owner, strict=True) if o == owner]
                    flat_apply(
                        owned, partial(_broadcast, src=dist.get_global_rank(self.group, owner), group=self.group)
                    )

    def tracked(self) -> list[torch.optim.Optimizer | torch.Tensor]:
        """What memory tracking must be told of: the torch optimizer inside (its states), and
        the fp32 master weights it steps, which are no module's parameters."""
        inner: list[torch.optim.Optimizer | torch.Tensor] = [self.inner] if self.inner is not None else []
        return inner + list(self.masters.values())
