"""What one device computes: GEMMs by shape (and the model's own shapes), memory bandwidth,
and the fixed cost of a kernel. Measured on all ranks at once, so shared cores, caches and
memory bandwidth contend as they do in training."""

from dataclasses import dataclass
from functools import partial

import torch

from cost_models.layer_work import layer_work, output_layer_gemm
from planner.schemas import DType, Layout, TrainingSpec
from profiler.context import Context

TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}


@dataclass(frozen=True, slots=True)
class GemmSample:
    """One rank's median time of an (m x k) @ (k x n) GEMM."""

    m: int
    n: int
    k: int
    dtype: DType
    median_s: float
    spread: float


@dataclass(frozen=True, slots=True)
class OpsSample:
    """One rank's op measurements."""

    gemms: tuple[GemmSample, ...]
    stream_bytes_per_s: float
    launch_overhead_s: float


def model_gemm_shapes(ctx: Context) -> list[tuple[int, int, int]]:
    """The GEMMs of the model's layers at the tensor-parallel degrees and micro-batches plans use."""
    model = ctx.settings.model
    if model is None:
        return []
    training = TrainingSpec(global_batch_size=1, seq_len=ctx.settings.seq_len)
    shapes = set()
    for tp in (t for t in (1, 2, 4, 8) if t <= ctx.world_size and model.num_attention_heads % t == 0):
        for mb in (1, 2):
            layout = Layout(
                data_parallel_degree=1, tensor_parallel_degree=tp, pipeline_parallel_degree=1, micro_batch_size=mb
            )
            work = layer_work(model, training, layout)
            for g in (*work.dense_gemms, output_layer_gemm(model, training, layout)):
                for shape in (g, *g.backward()):
                    shapes.add((shape.m, shape.n, shape.k))
    return sorted(shapes)


def measure(ctx: Context) -> list[OpsSample] | None:
    """Every rank's op samples, on rank 0."""
    gemms = []
    shapes = sorted({*ctx.settings.gemm_shapes, *model_gemm_shapes(ctx)})
    for dtype in ctx.settings.gemm_dtypes:
        for m, n, k in shapes:
            ctx.at("ops", f"gemm {m}x{n}x{k} {dtype}")
            a = torch.randn(m, k, device=ctx.device, dtype=TORCH_DTYPES[dtype])
            b = torch.randn(k, n, device=ctx.device, dtype=TORCH_DTYPES[dtype])
            timing = ctx.time(partial(torch.mm, a, b))
            gemms.append(GemmSample(m, n, k, dtype, timing.median_s, timing.spread))
    ctx.at("ops", "memory bandwidth")
    elems = ctx.settings.stream_bytes // 4
    x, y, z = (torch.rand(elems, device=ctx.device) for _ in range(3))
    stream = ctx.time(lambda: torch.add(x, y, out=z))
    ctx.at("ops", "kernel overhead")
    tiny = torch.rand(8, 8, device=ctx.device)
    overhead = ctx.time(lambda: torch.mm(tiny, tiny), repeats=max(ctx.settings.repeats, 20))
    sample = OpsSample(tuple(gemms), 3 * elems * 4 / stream.median_s, overhead.median_s)
    return ctx.gather(sample)
