"""Calibration: named correction factors fitted from measured runs on one cluster.

Stored in the cluster profile; ``cost_models.estimate`` applies them to every estimate on that
profile. Each factor says how the measured runs differed from the uncalibrated model:

    step time   = compute_scale x (compute + recompute + bubble + optimizer)
                + tensor_parallel_scale x tensor-parallel comm
                + communication_scale x (expert-, pipeline- and data-parallel comm)
                + step_overhead_s + micro_batch_overhead_s x micro-batch slots
    rank memory = model states + workspace + activation_memory_scale x activations
                + logits_memory_scale x logits + buffer_memory_scale x communication buffers
                + memory_overhead_bytes

where the micro-batch slots are the units of the schedule's critical path: m micro-batches,
or with p > 1 stages m x v chunk steps plus p - 1 to fill the pipeline. The identity
(1, 1, 1, 0, 0, 1, 1, 1, 0) leaves the model as it is. Logits and buffers are where
implementations differ most: an unfused cross-entropy keeps more fp32 copies of the logits than
Megatron-LM's fused one, and a runtime that reduces gradients after the backward holds no
bucket at the activation peak.
"""

from datetime import datetime
from typing import Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.errors import SchemaError

TIME_SCALES = ("compute_scale", "tensor_parallel_scale", "communication_scale")
"""The factors that multiply a time term: each must be > 0 (the base model's check refuses NaN and
infinity). At 0 every term it scales costs 0 s, and a search would rank every layout by what is left;
the fit never writes one below 1e-6. The memory scales may be 0: a runtime that reduces gradients
after the backward holds no buffer at the activation peak, and the fit finds exactly that."""


class Calibration(FrozenModel):
    """Correction factors of one cluster profile, and what they were fitted on."""

    compute_scale: float = Field(default=1.0, ge=0, description="Measured / modelled compute time.")
    tensor_parallel_scale: float = Field(
        default=1.0, ge=0, description="Measured / modelled tensor-parallel time (collectives inside every layer)."
    )
    communication_scale: float = Field(
        default=1.0, ge=0, description="Measured / modelled expert-, pipeline- and data-parallel communication."
    )
    step_overhead_s: float = Field(default=0.0, ge=0, description="Per-step time the model does not price.")
    micro_batch_overhead_s: float = Field(
        default=0.0, ge=0, description="Per micro-batch slot: framework and scheduling time the kernels leave out."
    )
    activation_memory_scale: float = Field(default=1.0, ge=0, description="Measured / modelled activations.")
    logits_memory_scale: float = Field(
        default=1.0, ge=0, description="Measured / modelled logits and loss buffers on the last stage."
    )
    buffer_memory_scale: float = Field(
        default=1.0, ge=0, description="Measured / modelled gradient buckets and collective staging buffers."
    )
    memory_overhead_bytes: float = Field(
        default=0.0, description="Per-rank bytes the model does not count (negative: counts and the runtime lacks)."
    )
    created: datetime
    trials: int = Field(ge=0, description="Measured plans the time factors were fitted on.")
    memory_samples: int = Field(ge=0, description="Measured ranks the memory factors were fitted on.")
    source: str = Field(default="", description="Where the trials are stored (study storage and name).")

    @model_validator(mode="after")
    def _check_time_scales(self) -> Self:
        for name in TIME_SCALES:
            if getattr(self, name) <= 0:
                raise SchemaError(
                    f"calibration.{name}={getattr(self, name)!r} must be > 0 (at 0 every term it scales costs 0 s);"
                    " fit it again with `planner tune`, or remove the calibration"
                )
        return self

    @property
    def factors(self) -> dict[str, float]:
        """The nine factors by name."""
        return {
            "compute_scale": self.compute_scale,
            "tensor_parallel_scale": self.tensor_parallel_scale,
            "communication_scale": self.communication_scale,
            "step_overhead_s": self.step_overhead_s,
            "micro_batch_overhead_s": self.micro_batch_overhead_s,
            "activation_memory_scale": self.activation_memory_scale,
            "logits_memory_scale": self.logits_memory_scale,
            "buffer_memory_scale": self.buffer_memory_scale,
            "memory_overhead_bytes": self.memory_overhead_bytes,
        }
