"""Re-planning after a change of devices (issue 18): the same model and training (global batch
size, sequence length, precision) searched again for the devices left, and what changed.

The global batch stays whole: the new layout's micro-batches are reshaped to it (B = d b m with
the new d, b and m), and the runtime divides each micro-batch's loss by m and averages the
gradients over the d replicas, so every step still takes the gradient of the global batch's mean
loss, as ElasWave (Wu et al. 2025) keeps the gradient scale when it reshapes micro-batches after
a failure. A checkpoint of the old plan then loads into the new layout (``runtime.checkpoint``).
"""

from dataclasses import dataclass

from planner.schemas import Layout, Plan
from planner.schemas.geometry import num_micro_batches

COMPARED: tuple[tuple[str, str], ...] = (
    ("data_parallel_degree", "dp"),
    ("tensor_parallel_degree", "tp"),
    ("pipeline_parallel_degree", "pp"),
    ("context_parallel_degree", "cp"),
    ("expert_parallel_degree", "ep"),
    ("micro_batch_size", "micro-batch size"),
    ("zero_stage", "ZeRO stage"),
    ("sequence_parallel", "sequence parallel"),
    ("recompute", "recompute"),
    ("recompute_modules", "recompute modules"),
    ("schedule", "schedule"),
    ("virtual_stages", "virtual stages"),
    ("vocabulary_layout", "vocabulary layout"),
)
"""The layout fields a re-plan reports when they change, with their names in the report."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Replan:
    """A plan searched again for other devices, beside the plan it replaces."""

    old: Plan
    new: Plan
    checkpoint_step: int | None = None
    """The steps done in the checkpoint found loadable by the new plan; None: none was checked."""

    @property
    def throughput_loss(self) -> float:
        """The predicted tokens/s lost, as a share of the old plan's (negative: a gain)."""
        return 1.0 - self.new.estimate.tokens_per_s / self.old.estimate.tokens_per_s


def layout_changes(old: Layout, new: Layout, global_batch_size: int) -> tuple[str, ...]:
    """What differs between two layouts of one global batch: ``name: old -> new`` for each field
    of ``COMPARED`` that changed, and the micro-batches per step when their count changed."""
    lines = [
        f"{label}: {_shown(getattr(old, name))} -> {_shown(getattr(new, name))}"
        for name, label in COMPARED
        if getattr(old, name) != getattr(new, name)
    ]
    before, after = num_micro_batches(global_batch_size, old), num_micro_batches(global_batch_size, new)
    if before != after:
        lines.append(f"micro-batches per step and replica: {before} -> {after}")
    return tuple(lines)


def summary(replan: Replan) -> tuple[str, ...]:
    """The re-plan's report, one line each: devices, the layout's changes, the predicted step time
    and throughput, and what a resumed run keeps."""
    old, new = replan.old, replan.new
    batch = old.training.global_batch_size
    lines = [
        f"devices: {old.cluster.world_size} ({old.cluster.spec}) -> {new.cluster.world_size} ({new.cluster.spec})",
        f"layout: {old.layout.describe()} -> {new.layout.describe()}",
        *("  " + line for line in layout_changes(old.layout, new.layout, batch) or ("no change",)),
        f"predicted step time: {old.estimate.step_time_s:.4g} s -> {new.estimate.step_time_s:.4g} s",
        f"predicted tokens/s: {old.estimate.tokens_per_s:,.0f} -> {new.estimate.tokens_per_s:,.0f} "
        f"(throughput {'loss' if replan.throughput_loss >= 0 else 'gain'} {abs(replan.throughput_loss):.1%})",
        f"kept: model {old.model.name}, global batch {batch} x {old.training.seq_len} tokens "
        "(the gradient of the whole batch's mean loss each step)",
    ]
    if replan.checkpoint_step is not None:
        lines.append(f"checkpoint: step {replan.checkpoint_step} loads into the new layout (resharded)")
    return tuple(lines)


def _shown(value: object) -> str:
    """A layout field's value as the report shows it (enums by value)."""
    return str(getattr(value, "value", value))
