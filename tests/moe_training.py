"""tiny-moe trained as the MoE parity tests train it: one setting (batch, sequence, steps, seed,
SGD's learning rate) for the runtime's Trainer and the single-process reference it must match."""

import functools
from typing import Any

import numpy as np
import torch

from planner.files.models import load_model
from planner.schemas import DType, Layout
from planner.schemas.routing import ExpertPlacement
from runtime.data import synthetic_batch
from runtime.expert_parallel import PlacementTable
from runtime.model import Decoder
from runtime.reference import reference_training
from runtime.trainer import Trainer

MOE = load_model("tiny-moe")  # 4 layers, 4 experts of width 256, top-2, hidden 128, 2 kv heads (tp <= 2)
BATCH, SEQ, STEPS, SEED, LR = 8, 16, 3, 0, 0.1
TOLERANCE = 1e-5
"""Losses of an fp32 layout trained with SGD against the reference's (as the dense parity tests)."""

SHUFFLED: PlacementTable = (((0, 3), (1, 2)), ((2, 1), (3, 0)), ((1, 2), (0, 3)), ((3, 0), (2, 1)))
"""ep 2: every layer its own non-contiguous placement, experts out of order within a rank."""

REPLICATED: PlacementTable = (((0, 1, 2), (0, 3)), ((1, 3), (2, 0, 3)), ((0, 1), (2, 3)), ((3, 2, 1), (0, 1)))
"""ep 2: some layers with an expert on both ranks (and uneven counts), one layer without replicas."""

PLACED = ExpertPlacement(slots=(((1, 2), (0, 3)), ((0, 3), (1, 2)), ((2, 1), (3, 0)), ((1, 2), (0, 3))))
"""A plan's placement (schemas.routing), not contiguous, differing by layer."""


def layout_of(kw: dict[str, Any], **defaults: Any) -> Layout:
    """A layout of ``kw`` over ``defaults`` over tp1, pp1 and micro-batches of one sequence."""
    base = {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "micro_batch_size": 1}
    return Layout(**{**base, **defaults, **kw})


def moe_trainer(layout: Layout, placement: PlacementTable | None = None, dtype: DType = DType.FP32) -> Trainer:
    """This rank's Trainer of tiny-moe under ``layout`` (SGD, the setting above, on the CPU)."""
    return Trainer(
        MOE,
        layout,
        global_batch_size=BATCH,
        seed=SEED,
        optimizer="sgd",
        lr=LR,
        device=torch.device("cpu"),
        placement=placement,
        dtype=dtype,
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (inputs, targets), as the reference trains on it."""
    return synthetic_batch(MOE.vocab_size, BATCH, SEQ, step=step, seed=SEED)


def train_losses(trainer: Trainer, steps: int = STEPS) -> list[float]:
    """The losses of ``steps`` steps of ``trainer`` (every rank calls it)."""
    return [trainer.step(*batch(s)) for s in range(steps)]


@functools.cache
def train_reference(steps: int = STEPS) -> tuple[list[float], Decoder]:
    """The single-process reference's losses and the model they trained, in the same setting
    over ``steps`` steps (computed once per count: several tests compare with it; read it only)."""
    return reference_training(MOE, global_batch_size=BATCH, seq_len=SEQ, steps=steps, seed=SEED, optimizer="sgd", lr=LR)


def reference_routing(step: int) -> np.ndarray:
    """The reference's expert ids of step ``step``'s batch before any update: (tokens, MoE
    layers, k), tokens row by row, as a routing trace orders them."""
    net = Decoder(MOE, seed=SEED)
    for block in net.layers.values():
        block.mlp.routing_trace = []
    net(batch(step)[0])
    return np.stack([torch.cat(block.mlp.routing_trace).numpy() for block in net.layers.values()], axis=1)
