"""Per-rank memory of a layout, per pipeline stage, in bytes.

Sources: model states under ZeRO from Rajbhandari et al. (SC20) sec. 5; activations from
Korthikanti et al. 2022 (``cost_models.activations``); micro-batches in flight from
``cost_models.pipeline``; the stage's parameters from ``cost_models.params``.

Constants (conventions, stated once here):
  - ``CUDA_WORKSPACE_BYTES`` = 1 GiB per rank on a CUDA device: the CUDA context with PyTorch's
    kernels loaded (about 0.3-0.6 GiB on A100/H100 with CUDA 12 lazy loading), cuBLAS workspaces
    (PyTorch's default on Hopper is 32 MiB per handle and stream), NCCL's per-communicator
    buffers (NCCL_BUFFSIZE 4 MiB per channel and peer, over the tp/dp/pp communicators) and
    some caching-allocator slack. 0 on a device whose name contains "cpu". This is not a
    fragmentation margin: callers keep their own safety margin on top.
  - Data-parallel gradient buckets: ``GRAD_BUCKETS`` = 2 buckets (one reducing while the next
    fills) of ``GRAD_BUCKET_ELEMENTS`` = 25 M elements in fp32 (4 bytes), capped by the
    gradients the rank reduces; present when the rank has a data-parallel peer. 25 M follows
    PyTorch DDP's default ``bucket_cap_mb=25``, read as elements because reductions run in fp32.
  - Tensor-parallel staging: one activation, s b h x dtype bytes, when t > 1 (Megatron-LM's
    global buffer for the sequence-parallel all-gather / all-reduce).
  - Expert-parallel staging: send and receive buffers of one micro-batch's routed tokens,
    2 x k s b h x dtype bytes (split by t with sequence parallelism), when ep > 1.
  - ZeRO-3 gathered parameters: ``ZERO3_GATHERED_UNITS`` = 2 units (the one in use and the next,
    prefetched), a unit being the largest module gathered at once on the stage (a transformer
    layer, the embedding or the output layer on this rank's tensor-parallel shard), in training
    precision; as DeepSpeed's estimator, whose 4 x largest_layer_params bytes is the same term.
"""

import functools
from dataclasses import dataclass
from typing import Final

from cost_models.activations import (
    embedding_activation_bytes,
    kept_bytes,
    layer_activations,
    logits_bytes,
    output_layer_activation_bytes,
    rematerialized_bytes,
)
from cost_models.params import embedding_params, layer_params, norm_params
from cost_models.pipeline import defers_gradient_reduction
from planner.schemas import (
    ClusterProfile,
    DeviceKind,
    DType,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    Schedule,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import in_flight_micro_batches, num_micro_batches, stage_layers

CUDA_WORKSPACE_BYTES: Final = 1 << 30
GRAD_BUCKET_ELEMENTS: Final = 25_000_000
GRAD_BUCKET_ELEMENT_BYTES: Final = 4
GRAD_BUCKETS: Final = 2
ZERO3_GATHERED_UNITS: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    """Bytes of model states one rank holds (Rajbhandari et al. SC20, sec. 5)."""

    weights_bytes: float
    """Parameters in training precision."""
    gradients_bytes: float
    """Gradients in training precision."""
    optimizer_states_bytes: float
    """Adam: fp32 master copy (mixed precision only) and two fp32 moments."""

    @property
    def total_bytes(self) -> float:
        """Sum of the three."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_states_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, before ZeRO sharding."""

    dense: float
    """Parameters replicated over the whole data-parallel group (ZeRO shards them over d)."""
    expert: float
    """MoE expert parameters, replicated over d / ep ranks (ZeRO shards them over d / ep)."""
    largest_unit: float
    """Parameters of the largest module ZeRO-3 gathers at once (a layer's sharded part, the
    embedding or the output layer)."""
    units: int = 1
    """Modules sharded and gathered one at a time under ZeRO 2-3: one per transformer layer, and
    one for the embedding, final norm and output layer the stage holds (FSDP's wrapping of each
    block and the root, as torchtitan does); each costs its own collectives."""

    @property
    def total(self) -> float:
        """All parameters on the rank."""
        return self.dense + self.expert


def model_state_bytes(params: float, shard_degree: int, zero_stage: ZeroStage, dtype: DType) -> ModelStates:
    """Weights, gradients and Adam states of ``params`` parameters on one rank under ZeRO.

    Source: Rajbhandari et al. (SC20) sec. 5. Mixed precision (bf16/fp16): 2 bytes of weights,
    2 of gradients and K = 12 of optimizer states (fp32 master weights and two moments) per
    parameter; fp32 training: 4, 4 and K = 8 (no master copy). Stage 1 divides the optimizer
    states by ``shard_degree``, stage 2 also the gradients, stage 3 also the weights. The
    gathered-parameter buffer of stage 3 is ``zero3_gather_buffer_bytes``, not included here.

    Args:
        params: parameters this rank holds without ZeRO (elements).
        shard_degree: ranks that share these parameters' states (d, or d / ep for experts).
        zero_stage: what is sharded.
        dtype: training precision.

    Returns:
        The three model-state terms, in bytes.
    """
    if shard_degree < 1:
        raise SchemaError(f"shard_degree={shard_degree} must be >= 1")
    element_bytes = dtype.bytes
    optimizer_bytes_per_param = 8 if dtype is DType.FP32 else 12
    d = shard_degree
    return ModelStates(
        weights_bytes=element_bytes * params / (d if zero_stage >= ZeroStage.PARAMETERS else 1),
        gradients_bytes=element_bytes * params / (d if zero_stage >= ZeroStage.GRADIENTS else 1),
        optimizer_states_bytes=optimizer_bytes_per_param * params / (d if zero_stage >= ZeroStage.OPTIMIZER else 1),
    )


def zero3_gather_buffer_bytes(largest_unit_params: float, dtype: DType) -> float:
    """Bytes of the parameters ZeRO-3 gathers at once: 2 units in training precision.

    One unit is in use while the next is prefetched (DeepSpeed ``stage3.py`` estimator:
    4 x largest_layer_params bytes for 2-byte weights; FSDP's default backward prefetch).
    """
    return ZERO3_GATHERED_UNITS * largest_unit_params * dtype.bytes


@functools.lru_cache(maxsize=8192)
def stage_params(model: ModelSpec, layout: Layout, stage: int) -> StageParams:
    """Parameters one rank of pipeline stage ``stage`` holds (memoized: memory, time and the
    optimizer all ask, and the inputs are immutable).

    Its transformer layers (``stage_layers``) split over t and, for experts, over ep; stage 0
    the word embedding split over t (vocabulary-parallel) plus learned positions, replicated;
    the last stage the final norm and the output layer split over t. With tied embeddings and
    p > 1 the last stage keeps its own copy of the embedding matrix (Megatron-LM); with p = 1
    the one copy serves both.
    """
    _check_stage(layout, stage)
    t, p = layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    ep = layout.expert_parallel_degree if model.is_moe else 1
    layer = layer_params(model, tensor_parallel_degree=t, expert_parallel_degree=ep)
    layers_here = stage_layers(model, layout)[stage]
    expert_per_layer = layer.mlp if model.is_moe else 0.0
    dense = layers_here * (layer.total - expert_per_layer)
    # Experts replicated over d / ep = 1 ranks are not sharded, so ZeRO-3 gathers none of them.
    experts_gathered = expert_per_layer if layout.data_parallel_degree // ep > 1 else 0.0
    units = [layer.total - expert_per_layer + experts_gathered] if layers_here else []
    word_embedding = model.vocab_size * model.hidden_size / t
    if stage == 0:
        embedding = word_embedding + (embedding_params(model) - model.vocab_size * model.hidden_size)
        dense += embedding
        units.append(embedding)
    if stage == p - 1:
        head = word_embedding if (not model.tie_word_embeddings or p > 1) else 0.0
        dense += norm_params(model) + head
        units.append(norm_params(model) + head)
    return StageParams(
        dense=dense,
        expert=layers_here * expert_per_layer,
        largest_unit=max(units, default=0.0),
        units=max(1, layers_here + (1 if stage in (0, p - 1) else 0)),
    )


def stage_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> float:
    """Activation bytes one rank of stage ``stage`` holds at its peak.

    Per-layer bytes (``kept_bytes`` of ``layer_activations``, with ``training.attention_kernel``) x the
    stage's layers x micro-batches in flight
    (``in_flight_micro_batches``, whole-stage units, so interleaving needs no further factor),
    plus one layer's recompute working set; stage 0 adds the embedding's ids and dropout mask
    per in-flight micro-batch (Korthikanti sec. 4.3); the last stage adds the final norm and
    output-projection inputs of the micro-batches whose loss awaits its backward: all m under
    GPipe, one otherwise (the last chunk runs its backward right after its forward).
    """
    _check_stage(layout, stage)
    m = _micro_batches(training, layout)
    s, b, t = training.seq_len, layout.micro_batch_size, layout.tensor_parallel_degree
    sp, dtype, recompute = layout.sequence_parallel, training.dtype, layout.recompute
    in_flight = in_flight_micro_batches(layout, stage, m)
    layers_here = stage_layers(model, layout)[stage]
    total = 0.0
    if layers_here:
        terms = layer_activations(
            model,
            seq_len=s,
            micro_batch_size=b,
            dtype=dtype,
            tensor_parallel_degree=t,
            sequence_parallel=sp,
            attention_kernel=training.attention_kernel,
        )
        per_layer, working = kept_bytes(terms, recompute), rematerialized_bytes(terms, recompute)
        total += per_layer * layers_here * in_flight + working
    if stage == 0:
        embedding = embedding_activation_bytes(
            model, seq_len=s, micro_batch_size=b, tensor_parallel_degree=t, sequence_parallel=sp
        )
        total += embedding * in_flight
    if stage == layout.pipeline_parallel_degree - 1:
        output = output_layer_activation_bytes(
            model, seq_len=s, micro_batch_size=b, dtype=dtype, tensor_parallel_degree=t, sequence_parallel=sp
        )
        total += output * _loss_micro_batches(layout, m)
    return total


def stage_logits_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> float:
    """fp32 logits on the last stage: one copy per micro-batch awaiting its backward, plus one.

    Each kept micro-batch holds its fp32 logits / softmax (4 s b V / t); the extra copy is the
    fp32 gradient of the logits built during the backward of one micro-batch. Under 1F1B this is
    2 x 4 s b V / t. Zero on other stages.
    """
    _check_stage(layout, stage)
    if stage != layout.pipeline_parallel_degree - 1:
        return 0.0
    one = logits_bytes(
        model,
        seq_len=training.seq_len,
        micro_batch_size=layout.micro_batch_size,
        tensor_parallel_degree=layout.tensor_parallel_degree,
    )
    return one * (_loss_micro_batches(layout, _micro_batches(training, layout)) + 1)


def communication_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, params: StageParams) -> float:
    """Gradient buckets and collective staging buffers of one rank (conventions in the module doc).

    Data parallel: min(2 x 25 M, gradients reduced) fp32 elements, counting dense gradients when
    d > 1 and expert gradients when d / ep > 1. Tensor parallel: s b h x dtype when t > 1.
    Expert parallel: 2 x k s b h x dtype (/t with sequence parallelism) when ep > 1 on an MoE.
    """
    d, t = layout.data_parallel_degree, layout.tensor_parallel_degree
    ep = layout.expert_parallel_degree if model.is_moe else 1
    reduced = (params.dense if d > 1 else 0.0) + (params.expert if d // ep > 1 else 0.0)
    total = GRAD_BUCKET_ELEMENT_BYTES * min(GRAD_BUCKETS * GRAD_BUCKET_ELEMENTS, reduced)
    tokens = training.seq_len * layout.micro_batch_size
    if t > 1:
        total += tokens * model.hidden_size * training.dtype.bytes
    if ep > 1:
        sp = t if layout.sequence_parallel else 1
        routed = model.num_experts_per_tok * tokens * model.hidden_size / sp
        total += 2 * routed * training.dtype.bytes
    return total


def workspace_bytes(cluster: ClusterProfile) -> float:
    """Framework workspace of one rank: ``CUDA_WORKSPACE_BYTES``, or 0 on a CPU device."""
    return 0.0 if cluster.device.kind is DeviceKind.CPU else float(CUDA_WORKSPACE_BYTES)


def stage_memory(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, stage: int
) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``stage``, by term.

    Model states from ``stage_params`` under ZeRO (dense parameters sharded over d, experts over
    d / ep), plus under ZeRO-3 with a shard group > 1 the gathered buffer of 2 units
    (``zero3_gather_buffer_bytes``); none with d = 1, where nothing is sharded or gathered (FSDP
    then falls back to no sharding). Under a pipeline ZeRO 2-3 hold what ZeRO-1 holds
    (``pipeline.defers_gradient_reduction``). Activations from ``stage_activation_bytes``, logits from
    ``stage_logits_bytes``, buffers from ``communication_buffer_bytes``, workspace from
    ``workspace_bytes``. Terms are summed as if they peak together (an upper bound). A calibrated
    cluster scales the activations, logits and buffers and adds its memory overhead to the workspace.

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
        InfeasibleConfigError: the global batch gives no whole micro-batch per replica.
    """
    params = stage_params(model, layout, stage)
    d = layout.data_parallel_degree
    ep = layout.expert_parallel_degree if model.is_moe else 1
    # A pipeline keeps ZeRO 2-3's gradients and gathered weights whole (defers_gradient_reduction).
    zero = ZeroStage.OPTIMIZER if defers_gradient_reduction(layout) else layout.zero_stage
    dense = model_state_bytes(params.dense, d, zero, training.dtype)
    expert = model_state_bytes(params.expert, d // ep, zero, training.dtype)
    gathered = 0.0
    if zero is ZeroStage.PARAMETERS and d > 1:
        gathered = zero3_gather_buffer_bytes(params.largest_unit, training.dtype)
    cal = cluster.calibration
    return MemoryBreakdown(
        weights_bytes=dense.weights_bytes + expert.weights_bytes + gathered,
        gradients_bytes=dense.gradients_bytes + expert.gradients_bytes,
        optimizer_states_bytes=dense.optimizer_states_bytes + expert.optimizer_states_bytes,
        activations_bytes=stage_activation_bytes(model, training, layout, stage)
        * (cal.activation_memory_scale if cal else 1.0),
        logits_bytes=stage_logits_bytes(model, training, layout, stage) * (cal.logits_memory_scale if cal else 1.0),
        communication_buffers_bytes=communication_buffer_bytes(model, training, layout, params)
        * (cal.buffer_memory_scale if cal else 1.0),
        workspace_bytes=workspace_bytes(cluster) + (cal.memory_overhead_bytes if cal else 0.0),
    )


def all_stage_memory(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout
) -> tuple[MemoryBreakdown, ...]:
    """``stage_memory`` of every pipeline stage, in pipeline order."""
    return tuple(stage_memory(model, training, cluster, layout, s) for s in range(layout.pipeline_parallel_degree))


def peak_stage_memory(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout
) -> MemoryBreakdown:
    """The breakdown of the stage whose rank needs the most memory (the first such stage on ties)."""
    return max(all_stage_memory(model, training, cluster, layout), key=lambda mem: mem.total_bytes)


def _check_stage(layout: Layout, stage: int) -> None:
    if not 0 <= stage < layout.pipeline_parallel_degree:
        raise SchemaError(
            f"stage={stage} is not a pipeline rank; it must be in 0..{layout.pipeline_parallel_degree - 1}"
        )


def _micro_batches(training: TrainingSpec, layout: Layout) -> int:
    m = num_micro_batches(training.global_batch_size, layout)
    if m < 1:
        raise InfeasibleConfigError(
            f"global_batch_size={training.global_batch_size} is smaller than data_parallel_degree x "
            f"micro_batch_size = {layout.data_parallel_degree} x {layout.micro_batch_size}; "
            "lower one of them or raise the global batch"
        )
    return m


def _loss_micro_batches(layout: Layout, micro_batches: int) -> int:
    """Micro-batches whose output layer and loss await their backward on the last stage."""
    return micro_batches if layout.schedule is Schedule.GPIPE else 1
