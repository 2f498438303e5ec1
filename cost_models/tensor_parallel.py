"""Tensor (and sequence) parallelism's time per layer and micro-batch.

Megatron-LM's tensor parallelism runs 2 all-reduces of the b s h activations (the rank's b s/cp
tokens under context parallelism) forward and 2
backward per layer; with sequence parallelism 2 all-gathers and 2 reduce-scatters each way
(Korthikanti et al. 2022, sec. 4.2.2). Full recomputation repeats the forward's collectives.
Where the profile timed this model's real tensor-parallel layer (``compute.measured_layer_s``
with ``sequence_parallel``), what it takes beyond the local layer is the tensor-parallel time:
its collectives and the framework's cost of sharding. An MoE layer whose experts are split over
the group (expert-tensor parallelism equal to tp, as the runtime runs it) reduces its output
once, where the dense MLP's row-parallel projection does: the same collectives. With the
experts folded (expert tensor parallelism 1: ``Layout.folds_experts``, Megatron-Core's MoE
parallel folding) the MoE block's input and output stay sequence-sharded and its routed experts
are whole on each rank, so it runs no tensor-parallel collective of its own: the layer keeps
attention's all-gather and reduce-scatter (half the layer's collectives, which move the same
bytes), and the shared experts', split over t as a dense MLP, where the model has them
(``moe_layer_share``). Units: seconds, bytes.
"""

from collections.abc import Iterable

from cost_models.comm import Group, priced_groups, slowest_collective_s
from cost_models.compute import measured_layer_s
from cost_models.context_parallel import local_seq_len
from planner.schemas import ClusterProfile, CollectiveOp, Layout, ModelSpec, Recompute, TrainingSpec


def tensor_parallel_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    local: tuple[float, float] | None,
) -> float:
    """Tensor-parallel seconds of one layer and micro-batch: forward, backward and, under full
    recomputation, the forward again (module docstring); 0 with t = 1.

    Args:
        model: hidden size, name of the profiled layer.
        training: sequence length and precision.
        cluster: links, collective and layer records.
        layout: tensor-parallel degree, micro-batch size, sequence parallel, recompute.
        tensor_groups: the tensor-parallel groups (devices).
        local: the (forward, backward) seconds of the local layer the real one's record holds
            (for an MoE model, its MoE layer: ``cost_models.timing``), or None if not profiled.

    Returns:
        Seconds per layer and micro-batch.
    """
    fwd_s, bwd_s = _forward_backward_s(model, training, cluster, layout, tensor_groups, local)
    return fwd_s + bwd_s + (fwd_s if layout.recompute is Recompute.FULL else 0.0)


def moe_layer_share(model: ModelSpec, layout: Layout) -> float:
    """An MoE layer's tensor-parallel time over a dense layer's (``tensor_parallel_layer_s``): 1
    with the experts split over t; folded, 1/2 (attention's collectives alone), or 1 with shared
    experts, which keep the MLP's collectives (module docstring)."""
    if not layout.folds_experts or model.shared_ffn_size:
        return 1.0
    return 0.5


def _forward_backward_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    local: tuple[float, float] | None,
) -> tuple[float, float]:
    """Forward and backward tensor-parallel seconds of one layer: measured beyond ``local``, or
    else the collectives priced over the tensor-parallel groups."""
    t, dt = layout.tensor_parallel_degree, training.dtype
    if t == 1:
        return 0.0, 0.0
    if local is not None:
        real = measured_layer_s(
            cluster.pricing_device,
            model.name,
            dt,
            t,
            layout.micro_batch_size,
            training.seq_len,
            sequence_parallel=layout.sequence_parallel,
        )
        if real is not None:
            return max(0.0, real[0] - local[0]), max(0.0, real[1] - local[1])
    act_bytes = layout.micro_batch_size * local_seq_len(training, layout) * model.hidden_size * dt.bytes
    groups = priced_groups(tensor_groups, cluster, rank_order=layout.device_map.is_identity)
    if layout.sequence_parallel:
        fwd = 2 * (
            slowest_collective_s(CollectiveOp.ALL_GATHER, act_bytes, groups, cluster)
            + slowest_collective_s(CollectiveOp.REDUCE_SCATTER, act_bytes, groups, cluster)
        )
    else:
        fwd = 2 * slowest_collective_s(CollectiveOp.ALL_REDUCE, act_bytes, groups, cluster)
    return fwd, fwd
