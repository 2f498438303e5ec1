"""The training loss: mean token cross-entropy over logits whose vocabulary may be split over the
tensor-parallel ranks, keeping one fp32 copy of the logits for the backward.

The method of Megatron-LM's ``vocab_parallel_cross_entropy`` (Shoeybi et al. 2019, sec. 3):
each rank casts its logits shard (b, s, V/t) to fp32, the per-token maximum, the target's logit
and the sum of exponentials are all-reduced over the tensor-parallel group, and the softmax
shard is computed in place in that fp32 copy and kept. The backward turns the kept softmax into
the gradient in place (softmax - one-hot, times the incoming gradient) and casts it to the
logits' precision; it needs no communication.

What it holds per micro-batch, one rank: the fp32 softmax, 4 s b V / t bytes, from forward to
backward; during the backward that buffer becomes the fp32 gradient, and its cast to bf16/fp16
adds 2 s b V / t. torch's ``F.cross_entropy`` over ``logits.float()`` keeps the fp32
log-softmax and builds two more fp32 copies in its backward (the gradients of nll_loss and of
log_softmax).
"""

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of a logits shard, vocabulary rows ``[offset, offset + V_local)``."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        offset: int,
        group: dist.ProcessGroup | None,
    ) -> torch.Tensor:
        work = logits.float()
        if work is logits:  # fp32 logits: the softmax must not overwrite the caller's tensor
            work = logits.clone()
        work = work.view(-1, work.shape[-1])
        flat_targets = targets.reshape(-1)
        peak = work.max(dim=-1).values
        if group is not None:
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
        work.sub_(peak.unsqueeze(-1))
        local_target = flat_targets - offset
        here = (local_target >= 0) & (local_target < work.shape[-1])
        local_target = local_target.clamp(0, work.shape[-1] - 1)
        target_logit = work.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * here
        work.exp_()
        total = work.sum(dim=-1)
        if group is not None:
            dist.all_reduce(target_logit, group=group)
            dist.all_reduce(total, group=group)
        work.div_(total.unsqueeze(-1))
        ctx.save_for_backward(work, local_target, here)
        ctx.logits_dtype = logits.dtype
        ctx.shape = logits.shape
        return (total.log() - target_logit).mean()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        softmax, local_target, here = ctx.saved_tensors
        grad = softmax  # the kept buffer becomes the gradient (it is not needed afterwards)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_target] -= here.to(grad.dtype)
        grad.mul_(grad_output / grad.shape[0])
        return grad.view(ctx.shape).to(ctx.logits_dtype), None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of ``logits`` (..., V) and ``targets`` (...).

    A DTensor sharded along its last dimension (the tensor-parallel output layer) is reduced over
    its mesh: every rank returns the same loss, a plain tensor.
    """
    if isinstance(logits, DTensor):
        (placement,) = logits.placements
        if not (isinstance(placement, Shard) and placement.dim in (-1, logits.ndim - 1)):
            return cross_entropy(logits.full_tensor(), targets)
        mesh = logits.device_mesh
        rows = -(-logits.shape[-1] // mesh.size())  # torch.chunk's split: the first ranks take ceil(V / t)
        offset = mesh.get_local_rank() * rows
        loss: torch.Tensor = _CrossEntropy.apply(logits.to_local(), targets, offset, mesh.get_group())  # type: ignore[no-untyped-call]
        return loss
    out: torch.Tensor = _CrossEntropy.apply(logits, targets, 0, None)  # type: ignore[no-untyped-call]
    return out
