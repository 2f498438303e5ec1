"""Estimate: what the cost models predict for one layout, broken down, with units in every name."""

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes one rank holds at its peak, by what they are."""

    weights_bytes: float
    """Parameters in training precision (plus gathered ZeRO-3 buffers and the FP8 copies an FP8
    recipe keeps)."""
    gradients_bytes: float
    """Gradients, sharded under ZeRO 2-3: what they add to the peak. Under a stack that allocates
    them on demand (``stacks.Stack.gradients_on_demand``), on a stage that runs no forward after
    its first backward, only what they exceed the activations and loss that backward frees by
    (often 0: the peak is then the forward's end, before any gradient exists)."""
    optimizer_states_bytes: float
    """fp32 master weights and Adam moments, sharded under ZeRO 1-3."""
    activations_bytes: float
    """Activations held for the backward pass, all in-flight micro-batches."""
    logits_bytes: float
    """fp32 logits and loss of one micro-batch on the stage with the output layer."""
    communication_buffers_bytes: float
    """Gradient-reduction buckets and collective staging buffers."""
    workspace_bytes: float
    """Framework and library workspace (context, GEMM workspace, allocator slack)."""
    host_bytes: float = 0.0
    """Host memory this rank fills with its offloaded optimizer states and the fp32 gradients
    they are stepped with (``Layout.optimizer_offload_fraction``): not device memory, not in
    ``total_bytes``."""

    @property
    def other_bytes(self) -> float:
        """Everything but model states and activations, as the design contract's ``other``."""
        return self.logits_bytes + self.communication_buffers_bytes + self.workspace_bytes

    @property
    def total_bytes(self) -> float:
        """Sum of all terms."""
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_states_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.communication_buffers_bytes
            + self.workspace_bytes
        )

    @property
    def tensors_bytes(self) -> float:
        """Every term but the workspace: what a run's measured peak of tensors counts (MemTracker,
        CUDA's ``max_memory_allocated``), which no tensor of the workspace is in."""
        return self.total_bytes - self.workspace_bytes

    def contract_dict(self) -> dict[str, float]:
        """The five keys of the design contract, in bytes."""
        return {
            "weights": self.weights_bytes,
            "gradients": self.gradients_bytes,
            "optimizer_states": self.optimizer_states_bytes,
            "activations": self.activations_bytes,
            "other": self.other_bytes,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StageEstimate:
    """One pipeline rank (all its model chunks): its layers and the memory of its busiest rank."""

    stage: int
    layers: int
    holds_embedding: bool
    holds_output_layer: bool
    memory: MemoryBreakdown
    compute_per_micro_batch_s: float
    """Forward + backward (+ recompute) of one micro-batch, communication excluded."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Seconds of one optimizer step on the critical path; the terms add up to the step time."""

    compute_s: float
    """Forward and backward of every micro-batch on the slowest stage."""
    recompute_s: float
    """Extra forward work for activation recomputation."""
    tensor_parallel_comm_s: float
    """Tensor/sequence-parallel collectives (not overlapped)."""
    expert_parallel_comm_s: float
    """MoE token all-to-all."""
    pipeline_comm_s: float
    """Point-to-point activation and gradient transfers between stages."""
    pipeline_bubble_s: float
    """Idle time of the schedule's fill and drain."""
    data_parallel_comm_s: float
    """Exposed part of gradient reduction and ZeRO gathers."""
    optimizer_s: float
    """Optimizer step over the rank's shard of parameters."""
    overhead_s: float = 0.0
    """Per-step time the model does not price, from the cluster's calibration (0 uncalibrated)."""
    data_parallel_comm_overlapped_s: float = 0.0
    """Part of the data-parallel communication hidden behind compute (not in the step time)."""
    context_parallel_comm_s: float = 0.0
    """Ring attention's key/value exchange that compute does not hide, or the all-to-all kind's
    all-to-alls (0 without context parallelism)."""
    optimizer_offload_s: float = 0.0
    """The host's part of an offloaded step (``Layout.optimizer_offload_fraction``): gradients
    copied to the host, the CPUs' Adam, the updated weights copied back; with the weights
    offloaded (``Layout.parameter_offload``), the shards' copies compute does not hide (0 without)."""
    activation_offload_s: float = 0.0
    """The copies of offloaded layers' activations (``Layout.activation_offload_layers``) down in
    the forward and up in the backward that compute does not hide (0 without)."""

    @property
    def step_time_s(self) -> float:
        """Sum of the critical-path terms."""
        return (
            self.compute_s
            + self.recompute_s
            + self.tensor_parallel_comm_s
            + self.expert_parallel_comm_s
            + self.pipeline_comm_s
            + self.pipeline_bubble_s
            + self.data_parallel_comm_s
            + self.optimizer_s
            + self.overhead_s
            + self.context_parallel_comm_s
            + self.optimizer_offload_s
            + self.activation_offload_s
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Predicted memory and time of one layout."""

    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    """Model FLOPs of one step (no recomputation), over all ranks."""
    hardware_flops_per_step: float
    """FLOPs the hardware executes, recomputation included."""
    mfu: float
    """Model FLOPs utilization: model FLOPs / (step time * ranks * peak)."""
    hfu: float
    """Hardware FLOPs utilization."""
    peak_memory_bytes: float
    """Largest per-rank memory over all stages."""
    memory_capacity_bytes: float
    """What one rank may use."""
    stages: tuple[StageEstimate, ...]
    time: TimeBreakdown
    host_memory_per_node_bytes: float = 0.0
    """Host memory the busiest node's ranks fill with offloaded optimizer states and activations (0
    without offload)."""
    host_memory_capacity_bytes: float | None = None
    """What one node's host may hold; None: not known (no offload can be checked against it)."""

    @property
    def peak_stage(self) -> StageEstimate:
        """The stage whose rank needs the most memory."""
        return max(self.stages, key=lambda s: s.memory.total_bytes)

    @property
    def fits(self) -> bool:
        """Whether the largest rank fits in the device's memory, and the offloaded states in the host's."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes and self.fits_host

    @property
    def fits_host(self) -> bool:
        """Whether the busiest node's offloaded states fit in its host memory (True without offload)."""
        if self.host_memory_per_node_bytes <= 0:
            return True
        return self.host_memory_capacity_bytes is not None and (
            self.host_memory_per_node_bytes <= self.host_memory_capacity_bytes
        )

    def to_json_dict(self) -> dict[str, object]:
        """The design contract's JSON object, plus per-stage detail."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "host_memory_per_node_bytes": self.host_memory_per_node_bytes,
            "host_memory_capacity_bytes": self.host_memory_capacity_bytes,
            "memory_breakdown_bytes": self.peak_stage.memory.contract_dict(),
            "time_breakdown_s": {f.name.removesuffix("_s"): getattr(self.time, f.name) for f in fields(self.time)},
            "stages": [
                {**asdict(s), "memory": {**asdict(s.memory), "total_bytes": s.memory.total_bytes}} for s in self.stages
            ],
        }
