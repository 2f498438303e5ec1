"""The runtime: executes a plan's layout with torch.distributed (and builds every DeviceMesh).

This is its public API, the one the profiler uses (``from runtime import ...``): the model it
trains and its loss, its optimizer, the parallelisms that time their own cost there (tensor
parallelism, FSDP sharding), the mesh builders, and the CPU threads a rank computes with.
Importing it imports torch; the CLI imports it only inside the commands that need it.
"""

from runtime.data_parallel import shard_units
from runtime.heartbeat import Heartbeat, Stopped, act_out_fault, stop_on_sigterm
from runtime.mesh import device_grid, group_mesh, layout_mesh
from runtime.model import TORCH_DTYPES, Decoder, attention_backend, builds_layers, default_dtype, loss_fn
from runtime.optim import DataParallelOptimizer, make_optimizer
from runtime.tensor_parallel import loss_context, tensor_parallel
from runtime.threads import core_share, cpu_threads_per_rank
from runtime.torch_compat import (
    SUPPORTED_TORCH,
    all_gather_single,
    reduce_scatter_single,
    require_supported_torch,
)
from runtime.trainer import Trainer

__all__ = [
    "SUPPORTED_TORCH",
    "TORCH_DTYPES",
    "DataParallelOptimizer",
    "Decoder",
    "Heartbeat",
    "Stopped",
    "Trainer",
    "act_out_fault",
    "all_gather_single",
    "attention_backend",
    "builds_layers",
    "core_share",
    "cpu_threads_per_rank",
    "default_dtype",
    "device_grid",
    "group_mesh",
    "layout_mesh",
    "loss_context",
    "loss_fn",
    "make_optimizer",
    "reduce_scatter_single",
    "require_supported_torch",
    "shard_units",
    "stop_on_sigterm",
    "tensor_parallel",
]
