"""Optimizers the runtime offers, and a ZeRO-1 optimizer that shards their state."""

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

OPTIMIZERS = ("adamw", "sgd")


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """AdamW (the planner's mixed-precision Adam, in the run's precision) or plain SGD (exact parity)."""
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor behind a DTensor (the tensor itself otherwise)."""
    return t.to_local() if isinstance(t, DTensor) else t


class ZeroOneOptimizer:
    """ZeRO stage 1 (Rajbhandari et al. 2020): every data-parallel rank keeps optimizer state only
    for the parameters it owns; gradients are averaged over the group, owners step, and each
    updated parameter is broadcast from its owner."""

    def __init__(self, name: str, params: list[torch.nn.Parameter], lr: float, group: dist.ProcessGroup) -> None:
        self.params, self.group = params, group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        loads = [0] * size
        self.owner: list[int] = []
        for p in params:  # greedy balance by size, in a fixed order every rank agrees on
            o = loads.index(min(loads))
            self.owner.append(o)
            loads[o] += p.numel()
        self.global_owner = [dist.get_global_rank(group, o) for o in self.owner]
        mine = [p for p, o in zip(params, self.owner, strict=True) if o == rank]
        self.inner = make_optimizer(name, mine, lr) if mine else None
        self.size, self.rank = size, rank

    def zero_grad(self) -> None:
        """Drop every gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Average gradients, step the owned parameters, broadcast the updates."""
        for p in self.params:
            if p.grad is not None:
                g = local(p.grad)
                dist.all_reduce(g, group=self.group)
                g.div_(self.size)
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for p, src in zip(self.params, self.global_owner, strict=True):
                dist.broadcast(local(p.data), src=src, group=self.group)
