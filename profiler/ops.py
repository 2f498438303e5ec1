"""What one device computes: GEMMs by shape (and the model's own shapes), memory bandwidth,
and the fixed cost of a kernel. Measured on all ranks at once, so shared cores, caches and
memory bandwidth contend as they do in training; each repeat of work counts its slowest rank,
as a synchronous step waits for it (the kernel overhead is each rank's own). ``measure`` also
takes the runtime's own costs: the pipeline schedule's per slot, and sharded data parallelism's
(FSDP's) per unit and micro-batch (``profiler.framework_ops``)."""

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.attention import sdpa_kernel

from planner.schemas import (
    AttentionKernel,
    AttentionRecord,
    DType,
    ElementwiseRecord,
    LayerNormRecord,
    LayerRecord,
    ModelSpec,
    OpKind,
    OpRecord,
    OptimizerRecord,
)
from planner.schemas.geometry import MeshAxis
from planner.schemas.training import default_reduce_dtype
from profiler.context import Context
from profiler.fp8_gemms import fp8_gemms
from profiler.framework_ops import pipeline_slot, sharded_units
from profiler.host_adam import HostAdam, measure_host_adam
from profiler.host_copies import HostCopies, measure_host_copies
from profiler.layer import LocalLayer, rank_share
from profiler.stats import GemmSample, Timing
from profiler.workspace import library_workspace_bytes
from runtime import (
    TORCH_DTYPES,
    DataParallelOptimizer,
    Decoder,
    attention_backend,
    builds_layers,
    default_dtype,
    group_mesh,
    loss_context,
    loss_fn,
    tensor_parallel,
)


@dataclass(frozen=True, slots=True)
class OpsSample:
    """One rank's op measurements."""

    gemms: tuple[GemmSample, ...]
    stream_bytes_per_s: float
    launch_overhead_s: float
    others: tuple[OpRecord, ...] = ()
    """Other ops, each with this rank's median times."""
    workspace_bytes: int | None = None
    """Device memory the kernel libraries took on their first calls beyond tensors (CUDA only:
    ``profiler.workspace``); None where not measured."""
    host_copies: HostCopies | None = None
    """Pinned host-to-device and device-to-host copy rates (CUDA only: ``profiler.host_copies``)."""
    host_adam: HostAdam | None = None
    """The CPU Adam rate while every rank steps, and the host's memory (CUDA only: ``profiler.host_adam``)."""


def measure(ctx: Context) -> list[OpsSample] | None:
    """Every rank's op samples, on rank 0."""
    ctx.at("ops", "library workspace")
    workspace = library_workspace_bytes(ctx.device, partial(_first_calls, ctx))
    gemms: list[GemmSample] = []
    shapes = sorted({*ctx.settings.gemm_shapes, *ctx.settings.model_gemm_shapes})
    count = len(ctx.settings.gemm_dtypes) * len(shapes)
    for dtype in ctx.settings.gemm_dtypes:
        for m, n, k in shapes:
            ctx.at("ops", f"gemm {len(gemms) + 1}/{count} {m}x{n}x{k} {dtype}")
            a = torch.randn(m, k, device=ctx.device, dtype=TORCH_DTYPES[dtype])
            b = torch.randn(k, n, device=ctx.device, dtype=TORCH_DTYPES[dtype])
            timing = ctx.time(partial(torch.mm, a, b), lockstep=True)
            gemms.append(GemmSample(m, n, k, dtype, timing.median_s, timing.spread))
    gemms += fp8_gemms(ctx, shapes)
    ctx.at("ops", "memory bandwidth")
    elems = stream_operand_bytes(ctx) // 4
    x, y, z = (torch.rand(elems, device=ctx.device) for _ in range(3))
    stream = ctx.time(lambda: torch.add(x, y, out=z), lockstep=True)
    ctx.at("ops", "kernel overhead")
    tiny = torch.rand(8, 8, device=ctx.device)
    overhead = ctx.time(lambda: torch.mm(tiny, tiny), repeats=max(ctx.settings.repeats, 20))
    others: list[OpRecord] = [
        ElementwiseRecord(num_elements=elems, dtype=DType.FP32, time_s=stream.median_s, spread=stream.spread)
    ]
    others += _attention_and_norm(ctx) + _layers(ctx) + _tensor_parallel_layers(ctx) + _output_layers(ctx)
    others += _optimizer(ctx) + pipeline_slot(ctx) + sharded_units(ctx)
    ctx.at("ops", "host-device copies")
    copies = measure_host_copies(ctx)
    ctx.at("ops", "host CPU Adam")
    adam = measure_host_adam(ctx)
    sample = OpsSample(
        tuple(gemms), 3 * elems * 4 / stream.median_s, overhead.median_s, tuple(others), workspace, copies, adam
    )
    return ctx.gather(sample)


def stream_operand_bytes(ctx: Context) -> int:
    """Each operand of the bandwidth kernel: ``settings.stream_bytes``, and on a GPU at least
    four times its L2 cache, so the three operands stream from HBM (an H100's 50 MiB L2 held
    most of the quick profile's 3 x 16 MiB, and the kernel would have timed the cache)."""
    if ctx.device.type != "cuda":
        return ctx.settings.stream_bytes
    l2_bytes = int(torch.cuda.get_device_properties(ctx.device).L2_cache_size)
    return max(ctx.settings.stream_bytes, 4 * l2_bytes)


def _first_calls(ctx: Context) -> None:
    """One small GEMM in each profiled precision and one forward and backward of each fused
    attention kernel in each precision attention is timed in (``attention_dtypes``), keeping no
    tensor: what makes the kernel libraries set themselves up (``profiler.workspace``)."""
    model = ctx.settings.model
    heads, head_dim = (model.num_attention_heads, model.head_size) if model else (8, 64)
    for dtype in ctx.settings.gemm_dtypes:
        a = torch.randn(256, 256, device=ctx.device, dtype=TORCH_DTYPES[dtype])
        torch.mm(a, a)
    for dtype in attention_dtypes(ctx.settings.gemm_dtypes, ctx.device):
        q = torch.randn(1, heads, 256, head_dim, device=ctx.device, dtype=TORCH_DTYPES[dtype], requires_grad=True)
        for kernel in attention_kernels(ctx.device):
            backend = attention_backend(kernel, ctx.device)
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                if _runs(partial(F.scaled_dot_product_attention, q, q, q, is_causal=True)):
                    torch.autograd.backward(F.scaled_dot_product_attention(q, q, q, is_causal=True).float().sum())


def _fwd_bwd(
    ctx: Context, fn: Callable[[], torch.Tensor], params: list[torch.Tensor], repeats: int | None = None
) -> tuple[Timing, Timing]:
    """Forward alone, then forward + backward of a scalar made of ``fn``'s output."""
    ((forward, both),) = time_pairs(ctx, [_forward_and_both(fn, params)], repeats)
    return forward, both


RETIMES = 2
"""How often ``time_pairs`` times again a pair whose forward + backward came out no slower than its
forward alone."""


def time_pairs(
    ctx: Context, pairs: Sequence[Sequence[Callable[[], object]]], repeats: int | None = None
) -> list[tuple[Timing, Timing]]:
    """(forward, forward + backward) of each of ``pairs`` (``_forward_and_both``), timed in lockstep
    rounds over all of them (``Context.time_each``). A pair whose forward + backward came out no
    slower than its forward alone was measured through a slow spell of the machine (a backward
    takes time): it is timed again, alone, up to ``RETIMES`` times, and the last timing stands.
    Lockstep timings are every rank's slowest, the same on every rank, so all ranks re-time the
    same pairs. (On a 2-core machine running other work, an MoE layer's forward + backward once
    timed below its forward, which prices its backward at nothing.)"""
    timings = ctx.time_each([fn for pair in pairs for fn in pair], repeats=repeats, lockstep=True)
    timed = list(zip(timings[::2], timings[1::2], strict=True))
    for _ in range(RETIMES):
        inverted = [i for i, (forward, both) in enumerate(timed) if both.median_s <= forward.median_s]
        if not inverted:
            break
        again = ctx.time_each([fn for i in inverted for fn in pairs[i]], repeats=repeats, lockstep=True)
        for i, forward, both in zip(inverted, again[::2], again[1::2], strict=True):
            timed[i] = (forward, both)
    return timed


def _forward_and_both(fn: Callable[[], torch.Tensor], params: list[torch.Tensor]) -> list[Callable[[], object]]:
    """``fn`` without autograd, and ``fn`` with the backward of a scalar made of its output."""

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return fn()

    def both() -> None:
        for p in params:
            p.grad = None
        torch.autograd.backward(fn().float().sum())

    return [forward, both]


def attention_kernels(device: torch.device) -> tuple[AttentionKernel, ...]:
    """The fused attention kernels timed on ``device``: on CUDA FlashAttention-2 and cuDNN's
    fused attention (``runtime.model.CUDA_ATTENTION_BACKENDS``), each as a plan naming it runs;
    elsewhere SDPA's own choice, recorded as flash (a CPU runs neither GPU kernel). A kernel
    this torch build cannot run at the shape (``_runs``) is left out, and the cost model prices
    it at the other's rates (``cost_models.compute.fused_attention_s``)."""
    return (AttentionKernel.FLASH, AttentionKernel.CUDNN) if device.type == "cuda" else (AttentionKernel.FLASH,)


def _runs(fn: Callable[[], torch.Tensor]) -> bool:
    """Whether SDPA has a kernel for ``fn`` under the backend selected (its "no available
    kernel" RuntimeError otherwise). Every rank of a profile has the same device and build, so
    each leaves out the same kernels and their timings stay in lockstep."""
    try:
        with torch.no_grad():
            fn()
    except RuntimeError:
        return False
    return True


ATTENTION_MIN_SEQ_LEN = 256
"""The shortest power-of-two length a profile times attention at (or its ``seq_len`` where shorter)."""
ATTENTION_TOP_SEQ_LEN = {"cuda": 16384, "cpu": 2048}
"""The longest power-of-two length a profile times attention at on each kind of device (or its
``seq_len`` where longer): a GPU's to the presets' published 16k, a CPU's to 2k (the local plans'
lengths; a CPU's attention at 16k takes seconds a call)."""


def attention_lengths(seq_len: int, device: torch.device) -> tuple[int, ...]:
    """Sequence lengths a profile times attention at: ``seq_len`` and every power of two from
    ``ATTENTION_MIN_SEQ_LEN`` to the device's top length or ``seq_len``. A kernel's rate changes
    with the length (how much of its tiling a causal mask skips, how full its last tiles are), and
    plans run lengths other than the profile's: their sequences, and the blocks context
    parallelism cuts them into (``cost_models.context_parallel.attention_calls``); the cost model
    interpolates between the lengths timed."""
    top = max(seq_len, ATTENTION_TOP_SEQ_LEN.get(device.type, ATTENTION_TOP_SEQ_LEN["cpu"]))
    powers = (2**e for e in range(ATTENTION_MIN_SEQ_LEN.bit_length() - 1, top.bit_length()))
    return tuple(sorted({seq_len, *(n for n in powers if n <= top)}))


def attention_dtypes(gemm_dtypes: tuple[DType, ...], device: torch.device) -> tuple[DType, ...]:
    """Precisions a profile times attention in: on a GPU each profiled one, as plans in each run
    their attention in it (``Precision.attention``; FlashAttention and cuDNN refuse fp32, so a
    default fp32 + bf16 profile records them in bf16: ``_runs`` leaves out what a kernel refuses);
    on a CPU the first only, the one CPU plans train in (its SDPA in bf16 took four times fp32's
    time, 0.7 s a call at 2k tokens on the 2-core machine, which would double a CPU profile)."""
    return gemm_dtypes if device.type == "cuda" else gemm_dtypes[:1]


def _attention_and_norm(ctx: Context) -> list[OpRecord]:
    model, s = ctx.settings.model, ctx.settings.seq_len
    heads, head_dim, hidden = (model.num_attention_heads, model.head_size, model.hidden_size) if model else (8, 64, 512)
    ctx.at("ops", "attention")
    # in each precision, at each length, causal and without a mask (ring attention's off-diagonal blocks)
    records: list[OpRecord] = []
    for dtype in attention_dtypes(ctx.settings.gemm_dtypes, ctx.device):
        for kernel, length, causal, attn in _attention_timings(ctx, heads, head_dim, dtype):
            records.append(
                AttentionRecord(
                    batch_size=1,
                    num_attention_heads=heads,
                    seq_len=length,
                    head_size=head_dim,
                    dtype=dtype,
                    kernel=kernel,
                    causal=causal,
                    fwd_time_s=attn[0].median_s,
                    fwd_bwd_time_s=attn[1].median_s,
                    spread=attn[1].spread,
                )
            )
    ctx.at("ops", "layernorm")
    dtype = ctx.settings.gemm_dtypes[0]
    x = torch.randn(s, hidden, device=ctx.device, dtype=TORCH_DTYPES[dtype], requires_grad=True)
    norm = torch.nn.LayerNorm(hidden, device=ctx.device, dtype=TORCH_DTYPES[dtype])
    ln = _fwd_bwd(ctx, lambda: norm(x), [x, *norm.parameters()])
    return [
        *records,
        LayerNormRecord(
            num_elements=s * hidden,
            dtype=dtype,
            fwd_time_s=ln[0].median_s,
            fwd_bwd_time_s=ln[1].median_s,
            spread=ln[1].spread,
        ),
    ]


def _attention_timings(
    ctx: Context, heads: int, head_dim: int, dtype: DType
) -> list[tuple[AttentionKernel, int, bool, tuple[Timing, Timing]]]:
    """(kernel, length, causal, (forward, forward + backward)) of every fused kernel that runs
    ``dtype`` at each of the profile's lengths, causal and without a mask."""
    timed: list[tuple[AttentionKernel, int, bool, tuple[Timing, Timing]]] = []
    for length in attention_lengths(ctx.settings.seq_len, ctx.device):
        q, k, v = (
            torch.randn(1, heads, length, head_dim, device=ctx.device, dtype=TORCH_DTYPES[dtype], requires_grad=True)
            for _ in range(3)
        )
        for kernel in attention_kernels(ctx.device):
            backend = attention_backend(kernel, ctx.device)
            for causal in (True, False):

                def attention(
                    q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, causal: bool = causal
                ) -> torch.Tensor:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    if _runs(attention):
                        timed.append((kernel, length, causal, _fwd_bwd(ctx, attention, [q, k, v])))
    return timed


def _layers(ctx: Context) -> list[OpRecord]:
    """Forward + backward of one layer at each (tp, micro-batch) a plan may use (with ``model``):
    at tp 1 the runtime's own layer (``_local_layer``), above it one tensor-parallel rank's slice
    with no communication (``profiler.layer``); and for an MoE model the runtime builds, its own
    MoE layer at tp 1 (``_moe_layers``), which then stands for the dense one there when every
    layer is MoE (the cost model reads the dense one at tp 1 for dense layers only)."""
    model = ctx.settings.model
    if model is None:
        return []
    moe = _moe_layers(ctx)
    only_moe = bool(moe) and all(model.is_moe_layer(i) for i in range(model.num_hidden_layers))
    out = []
    for dtype, tp in itertools.product(
        ctx.settings.gemm_dtypes,
        (
            t
            for t in (1, 2, 4, 8)
            if t <= ctx.world_size
            and model.num_attention_heads % t == 0
            and model.kv_heads % t == 0
            and not (only_moe and t == 1)
        ),
    ):
        out += _time_layer(ctx, _local_layer(ctx, tp, dtype), OpKind.LAYER, tp, None, dtype, ctx.settings.seq_len)
    return out + moe


def _local_layer(ctx: Context, tp: int, dtype: DType) -> torch.nn.Module:
    """The layer one tensor-parallel rank of ``tp`` computes, in ``dtype`` on the rank's device: at
    tp 1 of a dense model the runtime's own (``runtime.Decoder``'s first layer: its projections,
    rotary embedding and norms, as a run computes them); else ``LocalLayer``, the rank's slice
    of heads and MLP (the runtime's tensor-parallel layer, collectives included, is timed apart),
    which also stands in at tp 1 for an MoE layer, and for a layer the runtime does not build
    (``runtime.builds_layers``). A multi-head latent attention model's rank at any tp is the
    runtime's layer of its share of the heads and MLP (``rank_share``)."""
    model = ctx.settings.model
    assert model is not None
    if (tp == 1 or model.is_mla) and not model.is_moe_layer(0) and builds_layers(model):
        with default_dtype(TORCH_DTYPES[dtype]):
            return Decoder(rank_share(model, tp), seed=0, layers=range(1), embedding=False, output=False).to(ctx.device)
    return LocalLayer(model, tp).to(device=ctx.device, dtype=TORCH_DTYPES[dtype])


def _moe_layers(ctx: Context) -> list[OpRecord]:
    """Forward + backward of the runtime's own MoE layer (attention, router, top-k routing and
    every expert on the rank: expert-parallel degree 1) at tensor-parallel degree 1 and every
    micro-batch size, for an MoE ``model`` whose layers the runtime builds as specified
    (``runtime.builds_layers``): its first MoE layer (``first_moe_layer``), experts
    moe_intermediate_size wide and shared experts as planned. Its router is untrained and its
    inputs random, so tokens route close to uniformly over the experts, as the cost model assumes
    without a routing trace."""
    model = ctx.settings.model
    if model is None or not model.is_moe or not builds_layers(model):
        return []
    out = []
    for dtype in ctx.settings.gemm_dtypes:
        with default_dtype(TORCH_DTYPES[dtype]):
            chunk = _moe_chunk(model).to(ctx.device)
        out += _time_layer(ctx, chunk, OpKind.MOE_LAYER, 1, None, dtype, ctx.settings.seq_len)
    return out


def first_moe_layer(model: ModelSpec) -> int:
    """The index of ``model``'s first MoE layer (after DeepSeek's first dense layers), 0 for a
    dense model: the layer whose shape the profiler times as the model's MoE layer."""
    return next((i for i in range(model.num_hidden_layers) if model.is_moe_layer(i)), 0)


def _moe_chunk(model: ModelSpec) -> Decoder:
    """The runtime's chunk of the model's first MoE layer alone (its first layer if dense)."""
    first = first_moe_layer(model)
    return Decoder(model, seed=0, layers=range(first, first + 1), embedding=False, output=False)


def _optimizer(ctx: Context) -> list[OpRecord]:
    """The runtime's optimizer step (``runtime.DataParallelOptimizer`` over a one-rank group:
    fused AdamW, with bf16/fp16 weights over their fp32 masters slice by slice) on the parameters
    of the runtime's own layer at tp 1, with gradients, in each profiled precision (with
    ``model``): the optimizer's cost per parameter, per-tensor and per-slice overheads included,
    at the model's own tensor sizes."""
    model = ctx.settings.model
    if model is None:
        return []
    alone = group_mesh(ctx.device.type, ctx.world_size, 1, MeshAxis.DP).get_group()
    out: list[OpRecord] = []
    for dtype in ctx.settings.gemm_dtypes:
        ctx.at("ops", f"optimizer {dtype}")
        params = list(_local_layer(ctx, 1, dtype).parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        reduce = TORCH_DTYPES[default_reduce_dtype(dtype)]
        opt = DataParallelOptimizer("adamw", params, 1e-6, alone, shard=False, reduce_dtype=reduce)
        step = ctx.time(opt.step, repeats=ctx.settings.layer_repeats, lockstep=True)
        count = sum(p.numel() for p in params)
        out.append(
            OptimizerRecord(
                model=model.name, num_parameters=count, dtype=dtype, time_s=step.median_s, spread=step.spread
            )
        )
    return out


def _tensor_parallel_layers(ctx: Context) -> list[OpRecord]:
    """Forward + backward of the runtime's own tensor-parallel layer (DTensor, with and without
    sequence parallelism), on every group of t consecutive ranks at once (with ``model``): its
    collectives and the framework's cost of sharding, which the local layer leaves out. For an
    MoE model, the runtime's first MoE layer (``first_moe_layer``: the cost model reads this
    record as an MoE layer's) with every expert split over the group."""
    model = ctx.settings.model
    if model is None or ctx.world_size < 2 or not builds_layers(model):  # its layer would be another model's
        return []
    out = []
    degrees = [
        t
        for t in (2, 4, 8)
        if ctx.world_size % t == 0 and model.num_attention_heads % t == 0 and model.kv_heads % t == 0
    ]
    for tp, mesh, dtype, sp, local_s in _tensor_parallel_variants(ctx, degrees):
        with default_dtype(TORCH_DTYPES[dtype]):
            chunk = _moe_chunk(model).to(ctx.device)
        tensor_parallel(chunk, mesh, sequence_parallel=sp)
        out += _time_layer(ctx, chunk, OpKind.TP_LAYER, tp, sp, dtype, local_s)
    return out


def _tensor_parallel_variants(ctx: Context, degrees: list[int]) -> Iterator[tuple[int, DeviceMesh, DType, bool, int]]:
    """(tp, its group's mesh, precision, sequence parallel, local sequence length) of every
    variant to time: each degree on groups of tp consecutive ranks, in each profiled precision,
    with sequence parallelism too where tp > 1 divides the sequence."""
    for tp in degrees:
        mesh = group_mesh(ctx.device.type, ctx.world_size, tp, MeshAxis.TP)
        for dtype, sp in itertools.product(ctx.settings.gemm_dtypes, (False, True) if tp > 1 else (False,)):
            if sp and ctx.settings.seq_len % tp:
                continue
            yield tp, mesh, dtype, sp, ctx.settings.seq_len // tp if sp else ctx.settings.seq_len


def _output_layers(ctx: Context) -> list[OpRecord]:
    """Forward + backward of the runtime's own output layer (final norm, head and loss, on the
    last pipeline stage) at every tensor-parallel degree, sequence parallel or not, on every
    group of t consecutive ranks at once (with ``model``). Under tensor parallelism the head is
    split over the vocabulary and the loss is the vocabulary-parallel one, collectives included."""
    model = ctx.settings.model
    if model is None:
        return []
    out = []
    degrees = [t for t in (1, 2, 4, 8) if ctx.world_size % t == 0 and model.vocab_size % t == 0]
    for tp, mesh, dtype, sp, local_s in _tensor_parallel_variants(ctx, degrees):
        with default_dtype(TORCH_DTYPES[dtype]):
            chunk = Decoder(model, seed=0, layers=range(0), embedding=False, output=True).to(ctx.device)
        if tp > 1:
            tensor_parallel(chunk, mesh, sequence_parallel=sp)
        head = _WithLoss(chunk, ctx.settings.seq_len)
        with loss_context(tp):  # the backward too runs inside
            out += _time_layer(ctx, head, OpKind.OUTPUT_LAYER, tp, sp, dtype, local_s)
    return out


class _WithLoss(torch.nn.Module):
    """An output chunk and the loss the runtime trains with, on fixed targets; returns the loss."""

    def __init__(self, chunk: Decoder, seq_len: int) -> None:
        super().__init__()
        self.chunk, self.seq_len = chunk, seq_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        targets = torch.zeros(x.shape[0], self.seq_len, dtype=torch.long, device=x.device)
        return loss_fn(self.chunk(x), targets)


def _time_layer(
    ctx: Context,
    layer: torch.nn.Module,
    op: OpKind,
    tp: int,
    sp: bool | None,
    dtype: DType,
    local_seq_len: int,
) -> list[OpRecord]:
    """Forward and forward + backward of ``layer`` on (micro-batch, ``local_seq_len``, hidden)
    inputs at every micro-batch size of the settings, timed in rounds over all of them: ``op``
    records at tensor-parallel degree ``tp``, sequence parallel ``sp`` (None for ``layer`` and
    ``moe_layer``)."""
    model = ctx.settings.model
    assert model is not None
    sizes = ctx.settings.layer_micro_batches
    ctx.at("ops", f"{op} {dtype} tp={tp} sp={sp} micro-batch={','.join(map(str, sizes))}")
    pairs: list[list[Callable[[], object]]] = []
    for mb in sizes:
        x = torch.randn(
            mb, local_seq_len, model.hidden_size, device=ctx.device, dtype=TORCH_DTYPES[dtype], requires_grad=True
        )
        pairs.append(_forward_and_both(partial(layer, x), [x, *layer.parameters()]))
    out: list[OpRecord] = []
    for mb, (fwd, both) in zip(sizes, time_pairs(ctx, pairs, ctx.settings.layer_repeats), strict=True):
        out.append(
            LayerRecord(
                op=op,
                model=model.name,
                tensor_parallel_degree=tp,
                micro_batch_size=mb,
                seq_len=ctx.settings.seq_len,
                sequence_parallel=sp,
                dtype=dtype,
                fwd_time_s=fwd.median_s,
                fwd_bwd_time_s=both.median_s,
                spread=both.spread,
            )
        )
    return out
