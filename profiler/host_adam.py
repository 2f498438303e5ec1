"""The host's side of an optimizer offload: how fast a node's CPUs step AdamW on fp32 states, and
how much memory the host holds (``ClusterProfile.host``, ``cost_models.offload``).

Every rank steps a CPU AdamW of ``ADAM_ELEMENTS`` fp32 parameters at once (lockstep), with the
kernel and threads the job's own offloaded optimizer gets (torch's fused CPU AdamW, on the
node's cores split over its ranks, as ``runtime.threads`` gives both the profiler's and the
runtime's ranks; torchrun's default of one thread a rank would step slower), so
ranks that share a node's cores and memory see their shared rate; the node's rate is the sum of
its ranks'. Measured on GPU ranks only: on CPU ranks the host is the devices' own memory and
nothing is offloaded.
"""

import os
from dataclasses import dataclass
from typing import Final

import torch

from profiler.context import Context
from profiler.topology import cpu_memory_bytes
from runtime import make_optimizer

ADAM_ELEMENTS: Final = 1 << 24
"""Parameters each rank's timed step holds: 64 MiB of fp32 weights (256 MiB with gradients and
moments), past the CPU caches."""


@dataclass(frozen=True, slots=True)
class HostAdam:
    """One rank's CPU Adam rate while every rank steps, and its host's memory."""

    params_per_s: float
    host_memory_bytes: int


def adam_params_per_s(ctx: Context, elements: int = ADAM_ELEMENTS) -> float:
    """Parameters per second this rank's CPUs step with AdamW while every rank steps (its state
    made by a first step, outside the timing)."""
    weights = torch.zeros(elements, dtype=torch.float32).requires_grad_()
    weights.grad = torch.rand(elements, dtype=torch.float32)
    optimizer = make_optimizer("adamw", [weights], lr=1e-3)  # the runtime's: fused where torch has the kernel
    optimizer.step()
    return elements / ctx.time(optimizer.step, lockstep=True).median_s


def measure_host_adam(ctx: Context) -> HostAdam | None:
    """This rank's CPU Adam rate and its host's memory; None off a CUDA device (module docstring)."""
    if ctx.device.type != "cuda":
        return None
    return HostAdam(adam_params_per_s(ctx), host_memory_bytes())


def host_memory_bytes() -> int:
    """The host memory an offload can fill: what the host has available to this job
    (``topology.cpu_memory_bytes``: MemAvailable, or the cgroup limit where lower), at most its
    physical memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 0
    available = cpu_memory_bytes()
    return min(total, available) if total and available else total or available
