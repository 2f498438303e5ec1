"""The device memory a GPU's kernel libraries take on their first calls, beyond the tensors a job
allocates: cuBLAS's handle and workspace, cuDNN's and the attention kernels', and the kernels CUDA
loads on first use. The cost model otherwise assumes it (``cost_models.memory``); a profile that
measured it carries it as ``DeviceProfile.workspace_bytes``."""

from collections.abc import Callable

import torch


def driver_used_bytes(device: torch.device) -> int:
    """Bytes in use on ``device`` as the driver counts them (every process, context included)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def library_workspace_bytes(device: torch.device, first_calls: Callable[[], None]) -> int | None:
    """How much the driver's used memory grows over ``first_calls`` (the job's first GEMMs and
    attention calls, run once, keeping no tensor), with the caching allocator's free blocks
    returned before and after: what the libraries keep (handles, workspaces, loaded kernels). The
    CUDA context, created before, is not in it. None on a device other than a CUDA GPU.

    Call it before anything else on ``device`` runs a GEMM or an attention kernel: a library
    already initialised shows no growth.

    Args:
        device: the rank's device.
        first_calls: runs the kernels; every tensor it makes must be garbage when it returns.

    Returns:
        Bytes (>= 0), or None.
    """
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = driver_used_bytes(device)
    first_calls()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return max(driver_used_bytes(device) - before, 0)
