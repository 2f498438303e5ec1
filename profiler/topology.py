"""Who is where: hosts, local ranks, device name and kind, the memory each rank may use, and the
host's network interface type."""

import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.schemas import DeviceKind, NicKind
from profiler.context import Context
from runtime import core_share


@dataclass(frozen=True, slots=True)
class RankInfo:
    """What one rank reports about itself."""

    rank: int
    host: str
    local_rank: int
    local_world_size: int
    device_name: str
    device_kind: DeviceKind
    memory_bytes: int
    """Memory this rank may use: the device's on CUDA; the host's available memory shared by its ranks on CPU."""
    core_share: float = 1.0
    """runtime.core_share on CPU; 1 on CUDA."""
    nic: NicKind = NicKind.ETHERNET
    """The host's network interface type (``nic_kind``)."""
    compute_units: int = 1
    """Streaming multiprocessors of a GPU; 1 for a CPU rank (its matmul model is measured whole)."""


def cpu_memory_bytes() -> int:
    """Memory this process may use: the cgroup limit when one is set, else MemAvailable."""
    available = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    limit_file = Path("/sys/fs/cgroup/memory.max")
    if limit_file.exists():
        text = limit_file.read_text().strip()
        if text.isdigit():
            return min(available, int(text)) if available else int(text)
    return available


def cpu_name() -> str:
    """The CPU model, as /proc/cpuinfo names it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"cpu ({line.split(':', 1)[1].strip()})"
    except OSError:
        pass
    return "cpu"


RDMA_DEVICES = Path("/sys/class/infiniband")
"""Where Linux lists RDMA devices (InfiniBand HCAs and RoCE NICs), each port with its link layer."""


def nic_kind(rdma_devices: Path = RDMA_DEVICES) -> NicKind:
    """The host's network interface type: an RDMA port whose link layer is InfiniBand means
    InfiniBand, one whose link layer is Ethernet means RoCE (RDMA over Ethernet); without RDMA
    devices, plain Ethernet (what gloo over TCP uses). Descriptive only: the measured node
    matrix is what the planner prices."""
    layers = {
        layer.read_text().strip().lower()
        for layer in (rdma_devices.glob("*/ports/*/link_layer") if rdma_devices.is_dir() else ())
    }
    if "infiniband" in layers:
        return NicKind.INFINIBAND
    return NicKind.ROCE if "ethernet" in layers else NicKind.ETHERNET


def device_kind(device: torch.device) -> DeviceKind:
    """What ``device`` is: a CPU, or a GPU under CUDA or ROCm (a ROCm build of torch also calls
    its GPUs "cuda", and sets ``torch.version.hip``)."""
    if device.type == "cpu":
        return DeviceKind.CPU
    return DeviceKind.ROCM if torch.version.hip else DeviceKind.CUDA


def measure(ctx: Context) -> list[RankInfo] | None:
    """Every rank's RankInfo, on rank 0."""
    ctx.at("topology")
    if ctx.device.type == "cuda":
        name = torch.cuda.get_device_name(ctx.device)
        memory = torch.cuda.mem_get_info(ctx.device)[1]
        units = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    else:
        name = cpu_name()
        memory = cpu_memory_bytes() // ctx.local_world_size
        units = 1
    host, local_rank, local_world = socket.gethostname(), ctx.local_rank, ctx.local_world_size
    if ctx.settings.simulate_nodes:
        # Testing aid: contiguous blocks of ranks pose as separate nodes.
        local_world = ctx.world_size // ctx.settings.simulate_nodes
        host, local_rank = f"simulated-node{ctx.rank // local_world}", ctx.rank % local_world
    info = RankInfo(
        rank=ctx.rank,
        host=host,
        local_rank=local_rank,
        local_world_size=local_world,
        device_name=name,
        device_kind=device_kind(ctx.device),
        memory_bytes=int(memory),
        core_share=1.0 if ctx.device.type == "cuda" else core_share(ctx.local_world_size),
        nic=nic_kind(),
        compute_units=units,
    )
    return ctx.gather(info)
