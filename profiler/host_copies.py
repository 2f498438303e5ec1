"""Host-device copies: how fast a rank moves pinned host memory to its GPU and back, as an
optimizer or activation offload would (``non_blocking`` copies of page-locked buffers, which
run at the link's DMA rate; pageable memory is staged through a bounce buffer and is slower).
Every rank copies at once (lockstep), as every rank of a node offloads at once, so ranks that
share a PCIe switch or a CPU socket see their shared rate."""

from dataclasses import dataclass

import torch

from profiler.context import Context

MIB = 2**20


@dataclass(frozen=True, slots=True)
class HostCopies:
    """One rank's copy rates, bytes per second each way."""

    host_to_device_bytes_per_s: float
    device_to_host_bytes_per_s: float


def copy_bytes(stream_bytes: int) -> int:
    """Bytes a copy moves: four times the stream kernel's operand, at least 64 MiB (past the
    copy engines' start-up cost, which small copies are dominated by)."""
    return max(64 * MIB, 4 * stream_bytes)


def measure_host_copies(ctx: Context) -> HostCopies | None:
    """This rank's pinned host-to-device and device-to-host rates; None off a CUDA device (a CPU
    rank's "device" is host memory, and the stream kernel measures that)."""
    if ctx.device.type != "cuda":
        return None
    size = copy_bytes(ctx.settings.stream_bytes)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(size, dtype=torch.uint8, device=ctx.device)
    to_device = ctx.time(lambda: device.copy_(host, non_blocking=True), lockstep=True)
    to_host = ctx.time(lambda: host.copy_(device, non_blocking=True), lockstep=True)
    return HostCopies(size / to_device.median_s, size / to_host.median_s)
