"""The single-process reference: the same model, data and optimizer with no parallelism, whose
losses every parallel layout must reproduce."""

import torch

from planner.schemas import ModelSpec
from runtime.data import synthetic_batch
from runtime.model import Decoder, loss_fn
from runtime.optim import make_optimizer


def reference_losses(
    model: ModelSpec, *, global_batch_size: int, seq_len: int, steps: int, seed: int, optimizer: str, lr: float
) -> list[float]:
    """Loss of each of ``steps`` training steps on the whole global batch at once."""
    losses, _ = reference_training(
        model, global_batch_size=global_batch_size, seq_len=seq_len, steps=steps, seed=seed, optimizer=optimizer, lr=lr
    )
    return losses


def reference_training(
    model: ModelSpec, *, global_batch_size: int, seq_len: int, steps: int, seed: int, optimizer: str, lr: float
) -> tuple[list[float], Decoder]:
    """``reference_losses`` and the model they trained, whose parameters a layout's must equal."""
    torch.manual_seed(seed)
    net = Decoder(model, seed=seed)
    opt = make_optimizer(optimizer, list(net.parameters()), lr)
    losses = []
    for step in range(steps):
        inputs, targets = synthetic_batch(model.vocab_size, global_batch_size, seq_len, step=step, seed=seed)
        opt.zero_grad()
        loss = loss_fn(net(inputs), targets)
        torch.autograd.backward(loss)
        opt.step()
        losses.append(loss.item())
    return losses, net
