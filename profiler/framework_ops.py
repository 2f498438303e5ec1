"""What the runtime's frameworks cost of their own, beyond kernels and links: the pipeline
schedule's bookkeeping per slot (torch.distributed.pipelining's 1F1B) and sharded data
parallelism's (FSDP's) hooks, casts and copies per unit and micro-batch. Both run tiny modules
on every pair of consecutive ranks at once, in lockstep rounds, as ``profiler.ops`` times the
rest of what a device computes."""

from collections.abc import Callable
from functools import partial

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from planner.schemas import DType, OpRecord, PipelineSlotRecord, ShardedUnitRecord, ZeroStage
from planner.schemas.geometry import MeshAxis
from planner.schemas.training import default_reduce_dtype
from profiler.context import Context
from runtime import TORCH_DTYPES, all_gather_single, default_dtype, group_mesh, reduce_scatter_single, shard_units

PIPELINE_SLOT_MICRO_BATCHES = (2, 8)
"""The tiny schedule runs 2 and 8 micro-batches; per slot is the difference over the 6 slots between."""


def pipeline_slot(ctx: Context) -> list[OpRecord]:
    """The pipeline schedule's own cost per slot: 1F1B over every pair of consecutive ranks at
    once, with a stage too small to compute anything (8 features, one token). Each slot holds a
    forward, a backward and their two transfers; what it takes beyond the transfers' latency is
    the schedule's bookkeeping, which no kernel or link measurement holds."""
    if ctx.world_size % 2:
        return []
    ctx.at("ops", "pipeline slot")
    mesh = group_mesh(ctx.device.type, ctx.world_size, 2, MeshAxis.PP)
    stage_index = mesh.get_local_rank()
    steps = []
    for m in PIPELINE_SLOT_MICRO_BATCHES:
        module = torch.nn.Linear(8, 8, device=ctx.device)
        stage = PipelineStage(module, stage_index, 2, ctx.device, group=mesh.get_group())
        schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=lambda y, _: y.sum())
        x, target = torch.randn(m, 1, 8, device=ctx.device), torch.zeros(m, 1, 8, device=ctx.device)
        steps.append(
            partial(schedule.step, x) if stage_index == 0 else partial(schedule.step, target=target, losses=[])
        )
    few, many = ctx.time_each(steps, repeats=ctx.settings.layer_repeats, lockstep=True)
    slots = PIPELINE_SLOT_MICRO_BATCHES[1] - PIPELINE_SLOT_MICRO_BATCHES[0]
    per_slot_s = max(many.median_s - few.median_s, 0.0) / slots
    if per_slot_s <= 0:
        return []
    return [PipelineSlotRecord(num_stages=2, dtype=DType.FP32, time_s=per_slot_s, spread=many.spread)]


SHARDED_UNITS = 4
"""Tiny modules in the stack whose sharding is timed."""
SHARDED_MICRO_BATCHES = (1, 4)
"""The stack runs steps of 1 and 4 micro-batches; per micro-batch is the difference over the 3 between."""
SHARDED_MODES = ((2, False), (3, False), (2, True), (3, True))
"""(ZeRO stage, deferred): how the runtime shards, without a pipeline and under one."""


def sharded_units(ctx: Context) -> list[OpRecord]:
    """FSDP's own cost per unit and micro-batch, beyond the unit's compute and its collectives'
    latency: hooks, casts, copies into and out of the flat buffers. A stack of tiny units (8
    features) runs on every pair of consecutive ranks at once, sharded over the pair, in each of
    the runtime's ways (``SHARDED_MODES``): ZeRO-2 reduce-scatters each micro-batch's gradient,
    ZeRO-3 also gathers for the forward and the backward; deferred (under a pipeline) no unit
    reduces before the last backward and ZeRO-3 gathers once a micro-batch. Beside them the same
    stack unsharded, and one tiny all-gather and reduce-scatter on the pair, in the same rounds."""
    if ctx.world_size % 2:
        return []
    ctx.at("ops", "sharded unit")
    mesh = group_mesh(ctx.device.type, ctx.world_size, 2, MeshAxis.DP)
    group = mesh.get_group()
    few, many = SHARDED_MICRO_BATCHES
    out: list[OpRecord] = []
    for dtype in ctx.settings.gemm_dtypes:
        low = TORCH_DTYPES[dtype]
        reduce = TORCH_DTYPES[default_reduce_dtype(dtype)]  # as a plan in this precision sums them
        x = torch.randn(1, 8, device=ctx.device, dtype=low)
        stacks: list[torch.nn.Module] = [_tiny_stack(ctx.device, low)]
        for zero, _ in SHARDED_MODES:
            stack = _tiny_stack(ctx.device, torch.float32)
            shard_units(stack, stack, mesh, zero_stage=ZeroStage(zero), dtype=low, reduce_dtype=reduce)
            stacks.append(stack)
        modes = [(0, False), *SHARDED_MODES]
        steps: list[Callable[[], object]] = [
            partial(_sharded_step, stack, x, m, zero, deferred)
            for stack, (zero, deferred) in zip(stacks, modes, strict=True)
            for m in (few, many)
        ]
        shard, whole = torch.zeros(8, device=ctx.device, dtype=low), torch.zeros(16, device=ctx.device, dtype=low)
        steps.append(partial(all_gather_single, whole, shard, group=group))
        steps.append(partial(reduce_scatter_single, shard, whole, group=group))
        ctx.at("ops", f"sharded unit {dtype}")
        timings = ctx.time_each(steps, repeats=ctx.settings.layer_repeats, lockstep=True)
        per_micro_batch = [
            (timings[2 * i + 1].median_s - timings[2 * i].median_s) / (many - few) for i in range(len(modes))
        ]
        gather_s, reduce_s = timings[-2].median_s, timings[-1].median_s
        for i, (zero, deferred) in enumerate(SHARDED_MODES, start=1):
            collectives_s = {
                (2, False): reduce_s,
                (3, False): reduce_s + 2 * gather_s,
                (2, True): 0.0,
                (3, True): gather_s,
            }[zero, deferred]
            own_s = (per_micro_batch[i] - per_micro_batch[0]) / SHARDED_UNITS - collectives_s
            if own_s > 0:
                spread = timings[2 * i + 1].spread
                out.append(
                    ShardedUnitRecord(
                        zero_stage=ZeroStage(zero), deferred=deferred, dtype=dtype, time_s=own_s, spread=spread
                    )
                )
    return out


def _tiny_stack(device: torch.device, dtype: torch.dtype) -> torch.nn.Sequential:
    with default_dtype(dtype):
        return torch.nn.Sequential(*(torch.nn.Linear(8, 8, device=device) for _ in range(SHARDED_UNITS)))


def _sharded_step(stack: torch.nn.Module, x: torch.Tensor, micro_batches: int, zero: int, deferred: bool) -> None:
    """A step of ``micro_batches`` forwards and backwards as the runtime shards ``zero`` (0: not)."""
    for i in range(micro_batches):
        last = i == micro_batches - 1
        if isinstance(stack, FSDPModule):
            if deferred:  # as torch.distributed.pipelining drives a sharded stage
                stack.set_requires_gradient_sync(last)
                stack.set_reshard_after_backward(last)
            elif zero == 2:  # as the runtime keeps ZeRO-2's gathered weights until the last backward
                stack.set_reshard_after_backward(last)
        stack(x).float().sum().backward()
