"""RunReport: what the runtime measured for a plan, beside what the plan predicted."""

from datetime import datetime
from typing import Literal

from pydantic import Field

from planner.schemas._base import FrozenModel
from planner.schemas.layout import Layout


class RankMemory(FrozenModel):
    """One rank's peak memory during a training step.

    ``peak_bytes`` counts tensors (either method), so it compares with the estimate less its
    workspace (``tensors_predicted_bytes``). On CUDA the two figures beyond the tensors are kept
    apart, so that the workspace the estimate assumes can be measured: the allocator's slack
    (``reserved_bytes - peak_bytes``) and what the driver holds besides the allocator
    (``driver_used_bytes - reserved_bytes``: CUDA context, kernels, cuBLAS and NCCL buffers)."""

    rank: int = Field(ge=0)
    stage: int = Field(ge=0, description="Pipeline rank.")
    peak_bytes: int = Field(ge=0, description="Peak bytes of tensors during the tracked step.")
    predicted_bytes: float = Field(ge=0, description="The plan's estimate for this rank's stage, workspace included.")
    method: str = Field(description="How it was measured: 'cuda max_memory_allocated' or 'MemTracker'.")
    breakdown_bytes: dict[str, int] = Field(default_factory=dict, description="By category, where the method tells.")
    predicted_workspace_bytes: float = Field(
        default=0.0,
        ge=0,
        description="The estimate's workspace term (in predicted_bytes, with a calibrated cluster's memory "
        "overhead): memory no tensor holds; 0 on a CPU.",
    )
    reserved_bytes: int | None = Field(
        default=None,
        ge=0,
        description="CUDA: the caching allocator's peak reservation over the tracked step (max_memory_reserved).",
    )
    driver_used_bytes: int | None = Field(
        default=None,
        ge=0,
        description="CUDA: device memory in use (mem_get_info's total - free) right after the tracked step; "
        "counts other processes on the device too.",
    )

    @property
    def tensors_predicted_bytes(self) -> float:
        """The estimate of what tensors hold: ``predicted_bytes`` less the workspace."""
        return self.predicted_bytes - self.predicted_workspace_bytes


class Straggler(FrozenModel):
    """A rank whose time outside collectives departed from its peers' (``runtime.stragglers``)."""

    rank: int = Field(ge=0)
    host: str
    since_step: int = Field(ge=0, description="First step of the first window in which it departed.")
    named_at_step: int = Field(ge=0, description="Last step of the window that confirmed it.")
    compute_s: float = Field(
        ge=0, description="Its time a step outside collectives (median over the window that named it)."
    )
    peers: tuple[int, ...] = Field(description="The ranks it was compared with: those doing the same work.")
    peers_compute_s: float = Field(ge=0, description="The peers' median time a step outside collectives.")
    peers_wait_s: float = Field(ge=0, description="The peers' median time a step waiting inside collectives.")
    message: str = Field(description="The line the runtime logged.")


class SlowLink(FrozenModel):
    """A link whose process group waited longer in its collectives than its sibling groups did,
    its members' compute level with their peers' (``runtime.slow_links``)."""

    ranks: tuple[int, ...] = Field(description="Its two ends, or the whole group when it could not be narrowed down.")
    hosts: tuple[str, ...] = Field(description="Their hosts, in the same order.")
    group: tuple[int, ...] = Field(description="The process group (global ranks) whose collectives showed it.")
    axis: str = Field(default="", description="The group's mesh axis (tp, dp, pp), where it lies along one.")
    since_step: int = Field(ge=0, description="First step of the first window in which the group departed.")
    named_at_step: int = Field(ge=0, description="Last step of the window that confirmed it.")
    wait_s: float = Field(ge=0, description="The group's median wait a step (least over its members).")
    siblings: tuple[tuple[int, ...], ...] = Field(
        description="The groups carrying the same traffic it was compared with."
    )
    siblings_wait_s: float = Field(ge=0, description="The siblings' median wait a step.")
    message: str = Field(description="The line the runtime logged.")


class GroupTiming(FrozenModel):
    """One process group's members' time inside its collectives over a window."""

    ranks: tuple[int, ...] = Field(description="The group's global ranks, sorted.")
    wait_s: tuple[tuple[float, ...], ...] = Field(description="Per step, per member: time inside its collectives.")


class TimingWindow(FrozenModel):
    """Every rank's timings over one window of steps of the straggler detector."""

    first_step: int = Field(ge=0)
    compute_s: tuple[tuple[float, ...], ...] = Field(description="Per step, per rank: time outside collectives.")
    wait_s: tuple[tuple[float, ...], ...] = Field(description="Per step, per rank: time inside collectives.")
    groups: tuple[GroupTiming, ...] = Field(
        default=(),
        description="Per process group, its members' time inside its collectives (the slow-link detector's).",
    )


class RunReport(FrozenModel):
    """A plan run for a few steps: times, losses and memory, each beside its prediction."""

    schema_version: Literal[1, 2, 3, 4, 5] = Field(
        default=5,
        description="2: the layout may carry a device map, expert placement and vocabulary layout; "
        "3: the straggler detector's findings (stragglers, timing_windows, straggler_checks, stopped_by_fault); "
        "4: the slow-link detector's (slow_links, link_checks, timing_windows' groups); "
        "5: memory's predicted_workspace_bytes, and on CUDA reserved_bytes and driver_used_bytes.",
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
    precision: str = Field(description="What the runtime trained in: weights, master weights, compute.")
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
        description="Per rank, in rank order: bytes its context-parallel attention sent to other ranks in a step "
        "(the ring's key/value blocks and their gradients, or the all-to-all kind's shares of q, k, v and the output "
        "and their gradients; forward and backward), mean over the steps after the first; empty without context "
        "parallelism.",
    )
    stragglers: tuple[Straggler, ...] = Field(
        default=(), description="Ranks the straggler detector named, in the order it named them."
    )
    timing_windows: tuple[TimingWindow, ...] = Field(
        default=(), description="What the straggler detector judged, window by window (to judge again offline)."
    )
    straggler_checks: int = Field(
        default=0,
        ge=0,
        description="Times the detector judged one rank over one window (ranks with peers x windows): the "
        "denominator of its false-positive rate.",
    )
    slow_links: tuple[SlowLink, ...] = Field(
        default=(), description="Links the slow-link detector named, in the order it named them."
    )
    link_checks: int = Field(
        default=0,
        ge=0,
        description="Times the slow-link detector judged one process group over one window: the denominator "
        "of its false-positive rate.",
    )
    stopped_by_fault: bool = Field(
        default=False,
        description="The run ended early on a straggler or a slow link (--on-fault exit); its times stop there.",
    )
