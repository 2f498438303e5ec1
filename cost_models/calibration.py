"""A calibrated cluster's correction of the time breakdown (``schemas.calibration`` gives the
formula; ``planner.tune.calibrate`` fits it from measured runs on the same terms).

The compute terms are scaled by ``compute_scale``, the tensor-parallel one by
``tensor_parallel_scale``, the other communication by ``communication_scale``; a per-step and a
per-micro-batch-slot overhead are added. The data-parallel term is scaled inside
``cost_models.estimate`` (``data_parallel.data_parallel_time``), before the overlap with the
scaled compute is decided, so it is left alone here. Units: seconds.
"""

from dataclasses import replace
from typing import Final

from planner.schemas import Calibration, TimeBreakdown

COMPUTE_TERMS: Final = ("compute_s", "recompute_s", "pipeline_bubble_s", "optimizer_s")
"""TimeBreakdown terms a calibration's compute_scale multiplies."""
TENSOR_PARALLEL_TERMS: Final = ("tensor_parallel_comm_s",)
"""TimeBreakdown terms a calibration's tensor_parallel_scale multiplies."""
_SCALED_AFTER_COMPOSITION: Final = ("expert_parallel_comm_s", "pipeline_comm_s", "context_parallel_comm_s")
COMMUNICATION_TERMS: Final = (*_SCALED_AFTER_COMPOSITION, "data_parallel_comm_s")
"""TimeBreakdown terms a calibration's communication_scale multiplies (the data-parallel one
inside ``estimate``, before the overlap with the scaled backward is decided)."""


def calibrated_time(time: TimeBreakdown, calibration: Calibration, slots: int) -> TimeBreakdown:
    """The breakdown with the calibration's factors applied (module docstring).

    Args:
        time: the uncalibrated breakdown, its data-parallel terms already scaled.
        calibration: the cluster's factors.
        slots: micro-batch slots of the schedule's critical path (``pipeline.micro_batch_slots``).

    Returns:
        The calibrated breakdown, the overheads added to ``overhead_s``.
    """
    scaled = {name: getattr(time, name) * calibration.compute_scale for name in COMPUTE_TERMS}
    scaled |= {name: getattr(time, name) * calibration.tensor_parallel_scale for name in TENSOR_PARALLEL_TERMS}
    scaled |= {name: getattr(time, name) * calibration.communication_scale for name in _SCALED_AFTER_COMPOSITION}
    overhead = calibration.step_overhead_s + calibration.micro_batch_overhead_s * slots
    return replace(time, **scaled, overhead_s=time.overhead_s + overhead)
