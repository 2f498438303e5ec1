"""One training step's peak memory, as ``planner run`` measures it on its tracked step.

On the CPU, torch's MemTracker (``runtime.dry_run.tracked_peak``) counts the tensors PyTorch
tracks, by category. On CUDA three figures, each a layer further out: the allocator's peak of
tensors (``max_memory_allocated``, what the cost model's terms count), its peak reservation
(``max_memory_reserved``: tensors plus the caching allocator's slack), and what the driver reports
in use right after the step (``mem_get_info``: the reservation plus the CUDA context, loaded
kernels, cuBLAS workspaces and NCCL's buffers, and any other process on the device). The last
two are what the cost model's assumed workspace (``cost_models.memory.CUDA_WORKSPACE_BYTES``)
stands for, so a run on a GPU measures it.
"""

from dataclasses import dataclass, field

import torch

from runtime.dry_run import tracked_peak
from runtime.trainer import Trainer


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredPeak:
    """One step's peak memory on this rank."""

    peak_bytes: int
    """Tensors at their peak."""
    method: str
    """``MemTracker`` or ``cuda max_memory_allocated``."""
    breakdown_bytes: dict[str, int] = field(default_factory=dict)
    """By category (MemTracker only)."""
    reserved_bytes: int | None = None
    """CUDA: the caching allocator's peak reservation."""
    driver_used_bytes: int | None = None
    """CUDA: device memory in use after the step, as the driver counts it."""


def measured_step(
    trainer: Trainer, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device
) -> tuple[float, MeasuredPeak]:
    """One step of ``trainer`` (its loss) and its peak memory on ``device`` (module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        loss = trainer.step(inputs, targets)
        torch.cuda.synchronize(device)
        free_bytes, total_bytes = torch.cuda.mem_get_info(device)
        return loss, MeasuredPeak(
            peak_bytes=torch.cuda.max_memory_allocated(device),
            method="cuda max_memory_allocated",
            reserved_bytes=torch.cuda.max_memory_reserved(device),
            driver_used_bytes=total_bytes - free_bytes,
        )
    result: list[float] = []
    peak = tracked_peak(trainer, lambda: result.append(trainer.step(inputs, targets)))
    total = peak.pop("Total")
    return result[0], MeasuredPeak(peak_bytes=total, method="MemTracker", breakdown_bytes=peak)
