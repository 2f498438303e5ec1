"""Per-micro-batch time of each pipeline stage, split into compute, recompute and communication.

Forward and backward of every layer come from its GEMM shapes and elementwise traffic
(cost_models.layer_work, cost_models.compute). The backward of a GEMM is its input- and
weight-gradient GEMMs; elementwise backward moves twice the forward's bytes. FlashAttention
skips the masked half of a causal s x s product and its backward runs 5 GEMMs to the
forward's 2 (Dao 2023, FlashAttention-2, sec. 3), so it costs 2.5 forwards. Recomputation
(Korthikanti et al. 2022): full repeats the layer's forward and its tensor-parallel
collectives; selective repeats the attention core (nothing extra under FlashAttention, which
already recomputes it). Tensor parallel runs 2 all-reduces of b s h forward and 2 backward per
layer, or with sequence parallel 2 all-gathers and 2 reduce-scatters each way (Korthikanti et
al. sec. 4.2.2). MoE moves tokens with an all-to-all to the experts and one back, each way. Every micro-batch's
weight gradients are accumulated into fp32 buffers (Megatron-LM's main_grad, PyTorch AMP's
fp32 .grad): read the new gradient and the sum, write the sum, memory-bound. Where the profile
timed this model's own layer (``compute.measured_layer_s``), that time replaces the layer's
kernels: it holds every small op and launch the kernel sum leaves out; where it also timed the
real tensor-parallel layer, what that takes beyond the local layer is the tensor-parallel time.
The output layer (final norm, head, loss) likewise, where the profile timed the runtime's own,
vocabulary-parallel under tensor parallelism, its collectives counted as its compute. Under
ZeRO 2-3 each sharded unit (``StageParams.units``) adds, every micro-batch, what the profiler
timed FSDP spending of its own (``compute.measured_sharded_unit_s``: hooks, casts, copies; its
collectives are priced in cost_models.estimate).
Units: seconds.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from cost_models import layer_work as lw
from cost_models.comm import Group, collective_time_s
from cost_models.compute import (
    backward_gemms_time_s,
    elementwise_time_s,
    gemm_time_s,
    gemms_time_s,
    measured_layer_s,
    measured_output_layer_s,
    measured_sharded_unit_s,
)
from cost_models.memory import stage_params
from cost_models.pipeline import defers_gradient_reduction
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    DType,
    Layout,
    ModelSpec,
    Recompute,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.geometry import stage_layers


def grad_accumulation_bytes_per_param(dtype: DType) -> int:
    """Bytes moved to add one parameter's gradient into its fp32 accumulator: read e + 4, write 4."""
    return dtype.bytes + 4 + 4


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTime:
    """One micro-batch's forward + backward on one pipeline rank (all its chunks)."""

    compute_s: float
    recompute_s: float
    tensor_parallel_comm_s: float
    expert_parallel_comm_s: float
    backward_s: float
    """Backward compute alone: the window in which gradient reduction can overlap."""

    @property
    def total_s(self) -> float:
        """Everything the stage spends on one micro-batch."""
        return self.compute_s + self.recompute_s + self.tensor_parallel_comm_s + self.expert_parallel_comm_s


def has_uniform_links(cluster: ClusterProfile) -> bool:
    """Whether every link of a class is the same, so one group stands for all of its axis."""
    return cluster.intra_node_links.uniform is not None and cluster.inter_node_links.uniform is not None


def slowest_collective_s(
    op: CollectiveOp, message_bytes: float, groups: Iterable[Group], cluster: ClusterProfile
) -> float:
    """The slowest group's time: groups of one axis run at once and the step waits for all.

    On a cluster with uniform links every group of an axis costs the same, so one is priced.
    """
    uniform = has_uniform_links(cluster)
    worst = 0.0
    for group in groups:
        worst = max(worst, collective_time_s(op, message_bytes, group, cluster))
        if uniform:
            break
    return worst


def stage_times(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    *,
    tensor_groups: Iterable[Group],
    expert_groups: Iterable[Group],
) -> tuple[StageTime, ...]:
    """Per-micro-batch time of every pipeline stage."""
    dev, dt = cluster.device, training.dtype
    work = lw.layer_work(model, training, layout)
    elem_fwd = elementwise_time_s(work.elementwise_bytes, dev)
    dense_fwd = gemms_time_s(work.dense_gemms, dev, dt)
    dense_bwd = backward_gemms_time_s(work.dense_gemms, dev, dt)
    if work.flash_attention:
        attn_fwd = 0.5 * gemms_time_s(work.attention_gemms, dev, dt)
        attn_bwd = 2.5 * attn_fwd
    else:
        attn_elem = elementwise_time_s(work.attention_elementwise_bytes, dev)
        attn_fwd = gemms_time_s(work.attention_gemms, dev, dt) + attn_elem
        attn_bwd = backward_gemms_time_s(work.attention_gemms, dev, dt) + 2 * attn_elem
    layer_fwd = dense_fwd + attn_fwd + elem_fwd
    layer_bwd = dense_bwd + attn_bwd + 2 * elem_fwd
    measured = measured_layer_s(
        dev, model.name, dt, layout.tensor_parallel_degree, layout.micro_batch_size, training.seq_len
    )
    if measured is not None:  # the profiler timed this model's own layer: everything it launches
        layer_fwd, layer_bwd = measured
    recompute = {
        Recompute.NONE: 0.0,
        Recompute.SELECTIVE: 0.0 if work.flash_attention else attn_fwd,
        Recompute.FULL: layer_fwd,
    }[layout.recompute]

    tp_fwd, tp_bwd = _tensor_parallel_layer_s(model, training, cluster, layout, tensor_groups, measured)
    tp_layer = tp_fwd + tp_bwd + (tp_fwd if layout.recompute is Recompute.FULL else 0.0)

    ep_layer = 0.0
    if model.is_moe and layout.expert_parallel_degree > 1:
        routed = layout.micro_batch_size * training.seq_len * model.num_experts_per_tok
        a2a_bytes = routed * model.hidden_size * dt.bytes
        a2a = slowest_collective_s(CollectiveOp.ALL_TO_ALL, a2a_bytes, expert_groups, cluster)
        ep_layer = (4 + (2 if layout.recompute is Recompute.FULL else 0)) * a2a

    output_s = measured_output_layer_s(
        dev,
        model.name,
        dt,
        layout.tensor_parallel_degree,
        layout.micro_batch_size,
        training.seq_len,
        sequence_parallel=layout.sequence_parallel,
    )
    if output_s is None:
        out_gemm = lw.output_layer_gemm(model, training, layout)
        out_elem = elementwise_time_s(lw.output_layer_elementwise_bytes(model, training, layout), dev)
        output_s = gemm_time_s(out_gemm, dev, dt) + backward_gemms_time_s((out_gemm,), dev, dt) + out_elem
    embed_s = 3 * elementwise_time_s(lw.embedding_elementwise_bytes(model, training, layout), dev)

    sharded_unit_s = 0.0
    if layout.zero_stage >= ZeroStage.GRADIENTS and layout.data_parallel_degree > 1:
        sharded_unit_s = measured_sharded_unit_s(dev, layout.zero_stage, defers_gradient_reduction(layout), dt) or 0.0

    layers = stage_layers(model, layout)
    last = len(layers) - 1
    out = []
    for stage, n in enumerate(layers):
        extra = (embed_s if stage == 0 else 0.0) + (output_s if stage == last else 0.0)
        held = stage_params(model, layout, stage)
        extra += elementwise_time_s(grad_accumulation_bytes_per_param(dt) * held.total, dev)
        extra += held.units * sharded_unit_s
        out.append(
            StageTime(
                compute_s=n * (layer_fwd + layer_bwd) + extra,
                recompute_s=n * recompute,
                tensor_parallel_comm_s=n * tp_layer,
                expert_parallel_comm_s=n * ep_layer,
                backward_s=n * layer_bwd,
            )
        )
    return tuple(out)


def _tensor_parallel_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    local: tuple[float, float] | None,
) -> tuple[float, float]:
    """Tensor-parallel seconds of one layer, forward and backward: what the profiler's real
    tensor-parallel layer took beyond the ``local`` one (its collectives and the framework's cost
    of sharding), or else its collectives priced over the tensor-parallel groups."""
    t, dt = layout.tensor_parallel_degree, training.dtype
    if t == 1:
        return 0.0, 0.0
    if local is not None:
        real = measured_layer_s(
            cluster.device,
            model.name,
            dt,
            t,
            layout.micro_batch_size,
            training.seq_len,
            sequence_parallel=layout.sequence_parallel,
        )
        if real is not None:
            return max(0.0, real[0] - local[0]), max(0.0, real[1] - local[1])
    act_bytes = layout.micro_batch_size * training.seq_len * model.hidden_size * dt.bytes
    # With uniform links one group stands for all; a list, since it is priced more than once.
    groups = list(islice(tensor_groups, 1) if has_uniform_links(cluster) else tensor_groups)
    if layout.sequence_parallel:
        fwd = 2 * (
            slowest_collective_s(CollectiveOp.ALL_GATHER, act_bytes, groups, cluster)
            + slowest_collective_s(CollectiveOp.REDUCE_SCATTER, act_bytes, groups, cluster)
        )
    else:
        fwd = 2 * slowest_collective_s(CollectiveOp.ALL_REDUCE, act_bytes, groups, cluster)
    return fwd, fwd
