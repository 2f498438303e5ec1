"""What every export shares: the refusal of a plan feature its target cannot express, and the
plan's facts each target states in its own words (micro-batches, layers per model chunk).

An export never drops a feature silently: a layout the target cannot run as planned is refused
with one line naming the feature, why the target cannot express it, and what to plan instead.
The three targets share the planner's rank order (tensor axis fastest, then data, then pipeline;
``schemas.geometry``), so a plan on the identity device map means the same ranks in each.
"""

from typing import NoReturn

from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import chunk_layers, num_micro_batches
from planner.schemas.plan import PlanShape


def refuse(target: str, feature: str, reason: str, fix: str) -> NoReturn:
    """Raise the one-line refusal: ``<target> cannot express <feature>: <reason>; <fix>``."""
    raise InfeasibleConfigError(f"{target} cannot express {feature}: {reason}; {fix}")


def check_common(plan: PlanShape, target: str) -> None:
    """Refuse what none of the targets expresses: a rank-to-device map (each numbers its ranks
    as the launcher starts them), a chosen expert placement (each places experts in contiguous
    blocks) and a vocabulary split over the pipeline (Vocabulary Parallelism is in none of them)."""
    layout = plan.layout
    if not layout.device_map.is_identity:
        refuse(
            target,
            "the plan's device map",
            "it runs rank r on the device the launcher numbers r",
            "run the plan with `planner launch`, or plan again on the identity map",
        )
    if layout.expert_placement is not None:
        refuse(
            target,
            "the plan's expert placement",
            "it places expert e of E on expert-parallel rank e // (E / ep)",
            "plan again without --routing-trace",
        )
    if layout.vocabulary_layout.over_pipeline:
        refuse(
            target,
            f"vocabulary_layout={layout.vocabulary_layout}",
            "it keeps the embedding on the first pipeline stage and the output layer on the last",
            "plan again with --vocabulary-layout pinned",
        )


def micro_batches(plan: PlanShape) -> int:
    """Micro-batches per step on one data-parallel replica, B / (d b); refused unless whole."""
    layout, batch = plan.layout, plan.training.global_batch_size
    per_step = layout.data_parallel_degree * layout.micro_batch_size
    if batch % per_step:
        raise InfeasibleConfigError(
            f"global_batch_size={batch} is not a multiple of data_parallel_degree x micro_batch_size={per_step}; "
            "plan again with a batch that divides"
        )
    return num_micro_batches(batch, layout)


def layers_per_chunk(plan: PlanShape) -> tuple[int, ...]:
    """Transformer layers of each model chunk in pipeline order (p v entries); chunk c runs on
    pipeline rank c % p, as in the three targets' interleaved schedules."""
    return chunk_layers(plan.model, plan.layout)
