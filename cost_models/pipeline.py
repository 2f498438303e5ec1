"""Pipeline schedules' costs: bubbles, and when sharded gradients are reduced. (The split of
layers into chunks and the micro-batches in flight are layout geometry: ``schemas.geometry``.)

Sources: Narayanan et al. (SC21) sec. 2.2 for bubble fractions (p-1)/m and (p-1)/(v m).

ZeRO 2-3 under a pipeline (``defers_gradient_reduction``): torch.distributed.pipelining runs
every backward of a sharded (FSDP) stage without gradient sync and without resharding, and
reduce-scatters once, after the stage's last backward (PipelineStage.perform_reduce_grad; as
torchtitan runs pipeline with FSDP). The stage then holds its whole gradient during the step
and, after each backward, its gathered weights: ZeRO 2-3 save only the optimizer shard, as
ZeRO-1 does (DeepSpeed refuses ZeRO 2-3 with a pipeline; Megatron-LM offers ZeRO-1 alone).
Measured on tiny-gpt, dp 2 x pp 2, 8 micro-batches: each unit reduce-scattered once a step,
gathered once under ZeRO-2 and 9 (m + 1) times under ZeRO-3.
"""

from planner.schemas import Layout, ZeroStage


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
