"""Pipeline schedules: layer split, micro-batches in flight, and bubbles.

Sources: Narayanan et al. (SC21) sec. 2.2 for bubble fractions (p-1)/m and (p-1)/(v m);
Megatron-LM's interleaved schedule for warm-up depth, (p - r - 1) * 2 + (v - 1) * p forward
chunks before the first backward on rank r, which gives the first stage
p (1 + (p-1)/(p v)) micro-batches of activations (Korthikanti et al. 2022, sec. 4.2.3).

ZeRO 2-3 under a pipeline (``defers_gradient_reduction``): torch.distributed.pipelining runs
every backward of a sharded (FSDP) stage without gradient sync and without resharding, and
reduce-scatters once, after the stage's last backward (PipelineStage.perform_reduce_grad; as
torchtitan runs pipeline with FSDP). The stage then holds its whole gradient during the step
and, after each backward, its gathered weights: ZeRO 2-3 save only the optimizer shard, as
ZeRO-1 does (DeepSpeed refuses ZeRO 2-3 with a pipeline; Megatron-LM offers ZeRO-1 alone).
Measured on tiny-gpt, dp 2 x pp 2, 8 micro-batches: each unit reduce-scattered once a step,
gathered once under ZeRO-2 and 9 (m + 1) times under ZeRO-3.
"""

import functools

from planner.schemas import Layout, ModelSpec, Schedule, ZeroStage


def chunk_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers of each model chunk in pipeline order (p * v entries).

    Uses the layout's explicit split, else splits evenly and gives the remainder to the
    chunks after the first, which also holds the embedding.
    """
    if layout.layer_split is not None:
        return layout.layer_split
    chunks = layout.num_chunks
    base, extra = divmod(model.num_hidden_layers, chunks)
    receivers = set(range(1, extra + 1)) if extra < chunks else set(range(chunks))
    return tuple(base + (1 if c in receivers else 0) for c in range(chunks))


def stage_chunks(layout: Layout, stage: int) -> tuple[int, ...]:
    """Chunks held by pipeline rank ``stage``: stage, stage + p, stage + 2p, ..."""
    p = layout.pipeline_parallel_degree
    return tuple(stage + i * p for i in range(layout.virtual_stages))


@functools.lru_cache(maxsize=4096)
def stage_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers held by each pipeline rank (all its chunks).

    Memoized: every stage's memory and time asks for it, and inputs are immutable.
    """
    per_chunk = chunk_layers(model, layout)
    return tuple(sum(per_chunk[c] for c in stage_chunks(layout, s)) for s in range(layout.pipeline_parallel_degree))


def num_micro_batches(global_batch_size: int, layout: Layout) -> int:
    """Micro-batches per step on one data-parallel replica: B / (d b), assumed whole."""
    return global_batch_size // (layout.data_parallel_degree * layout.micro_batch_size)


def in_flight_micro_batches(layout: Layout, stage: int, micro_batches: int) -> float:
    """Micro-batches of a whole stage's activations held at the stage's peak.

    GPipe holds all m; 1F1B holds p - r on rank r; interleaved holds its warm-up chunks plus
    one, each 1/v of the stage. Capped by what the step has.
    """
    p, v, m = layout.pipeline_parallel_degree, layout.virtual_stages, micro_batches
    if layout.schedule is Schedule.GPIPE:
        return float(m)
    if layout.schedule is Schedule.ONE_F_ONE_B:
        return float(min(p - stage, m))
    warmup_chunks = (p - stage - 1) * 2 + (v - 1) * p
    return min(warmup_chunks + 1, m * v) / v


def bubble_fraction(layout: Layout, micro_batches: int) -> float:
    """Idle share of the ideal step: (p - 1) / m, or (p - 1) / (v m) interleaved."""
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    return (p - 1) / (v * micro_batches)


def defers_gradient_reduction(layout: Layout) -> bool:
    """Whether sharded gradients are kept whole and reduced once a step, after the last backward:
    ZeRO 2-3 with a pipeline and data-parallel peers (module docstring)."""
    return (
        layout.pipeline_parallel_degree > 1
        and layout.data_parallel_degree > 1
        and layout.zero_stage >= ZeroStage.GRADIENTS
    )
