"""RunReport: what the runtime measured for a plan, beside what the plan predicted."""

from datetime import datetime
from typing import Literal

from pydantic import Field

from planner.schemas._base import FrozenModel
from planner.schemas.layout import Layout


class RankMemory(FrozenModel):
    """One rank's peak memory during a training step."""

    rank: int = Field(ge=0)
    stage: int = Field(ge=0, description="Pipeline rank.")
    peak_bytes: int = Field(ge=0)
    predicted_bytes: float = Field(ge=0, description="The plan's estimate for this rank's stage.")
    method: str = Field(description="How it was measured: 'cuda max_memory_allocated' or 'MemTracker'.")
    breakdown_bytes: dict[str, int] = Field(default_factory=dict, description="By category, where the method tells.")


class RunReport(FrozenModel):
    """A plan run for a few steps: times, losses and memory, each beside its prediction."""

    schema_version: Literal[1, 2] = Field(
        default=2, description="2: the layout may carry a device map, expert placement and vocabulary layout."
    )
    created: datetime
    plan_sha256: str
    model: str
    layout: Layout
    world_size: int = Field(ge=1)
    backend: str
    device: str
    torch_version: str
    hosts: tuple[str, ...]
    precision: str = Field(description="The dtype the runtime trained in.")
    optimizer: str
    steps: int = Field(ge=1)
    first_step: int = Field(
        default=0, ge=0, description="Steps a resumed run found done in its checkpoint; its losses and times follow."
    )
    warmup_steps: int = Field(ge=0)
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    measured_step_time_s: float = Field(
        description="Median step time after the warm-up steps, the memory-tracked step left out."
    )
    predicted_step_time_s: float
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    memory: tuple[RankMemory, ...]
    expert_sent_bytes_per_step: tuple[float, ...] = Field(
        default=(),
        description="Per rank, in rank order: bytes its MoE all-to-alls sent to other ranks in a step (dispatch "
        "and combine, forward and backward), mean over the steps after the first; empty without expert parallelism.",
    )
    context_sent_bytes_per_step: tuple[float, ...] = Field(
        default=(),
        description="Per rank, in rank order: key/value bytes its ring attention sent in a step (blocks and their "
        "gradients, forward and backward), mean over the steps after the first; empty without context parallelism.",
    )
