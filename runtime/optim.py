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


def average_gradients(params: list[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """Average every gradient over ``group`` in one all-reduce of a flat buffer (one bucket, as
    DDP's buckets do, rather than one collective per parameter)."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


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
        mine = [p for p, o in zip(params, self.owner, strict=True) if o == rank]
        self.inner = make_optimizer(name, mine, lr) if mine else None
        self.size, self.rank = size, rank

    def zero_grad(self) -> None:
        """Drop every gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Average gradients, step the owned parameters, broadcast each owner's updates at once."""
        average_gradients(self.params, self.group)
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for owner in range(self.size):
                owned = [local(p.data) for p, o in zip(self.params, self.owner, strict=True) if o == owner]
                if not owned:
                    continue
                flat = torch.cat([t.reshape(-1) for t in owned])
                dist.broadcast(flat, src=dist.get_global_rank(self.group, owner), group=self.group)
                offset = 0
                for t in owned:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
