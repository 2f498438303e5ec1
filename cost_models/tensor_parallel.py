"""Tensor (and sequence) parallelism's time per layer and micro-batch.

Megatron-LM's tensor parallelism runs 2 all-reduces of the b s h activations (the rank's b s/cp
tokens under context parallelism) forward and 2
backward per layer; with sequence parallelism 2 all-gathers and 2 reduce-scatters each way
(Korthikanti et al. 2022, sec. 4.2.2). Full recomputation repeats the forward's collectives;
selective recomputation of a dense layer's MLP (``RecomputeModule.MLP``) or an MoE layer's block
(``MOE``) repeats that block's: its column-parallel input gather and row-parallel output reduction,
half the layer's (``recomputed_forward_share``); the other modules re-run no collective.
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
(``moe_layer_share``).

The profiler times the real layer on every group of t consecutive devices at once and keeps
the slowest (``profiler.ops``): its collectives ran over those groups' links. Where links
differ (``comm.has_uniform_links`` false) and the priced groups are others (a device map, or a
cluster the record did not come from), the record's time is moved by the difference the link
model prices between the two sets of groups: a tp2 layer timed across a slowed pair (a rate-shaped
link among namespaced test hosts) does not price a map that keeps tensor groups off that pair as
slow, nor the reverse. Units: seconds, bytes.
"""

from collections.abc import Iterable

from cost_models.activations import per_op_priced
from cost_models.comm import Group, has_uniform_links, priced_groups, slowest_collective_s
from cost_models.compute import measured_layer_s
from cost_models.context_parallel import local_seq_len
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    Layout,
    ModelSpec,
    Recompute,
    RecomputeModule,
    SelectiveRecompute,
    TrainingSpec,
)


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
            (for an MoE model, its MoE layer: ``cost_models.layer_time``), or None if not profiled.

    Returns:
        Seconds per layer and micro-batch.
    """
    fwd_s, bwd_s = tensor_parallel_forward_backward_s(model, training, cluster, layout, tensor_groups, local)
    return tensor_parallel_kind_s(model, layout, fwd_s, bwd_s, moe=False)


def tensor_parallel_kind_s(
    model: ModelSpec,
    layout: Layout,
    forward_s: float,
    backward_s: float,
    *,
    moe: bool,
    selective: SelectiveRecompute = SelectiveRecompute.MODULES,
) -> float:
    """Tensor-parallel seconds of one dense (MoE) layer and micro-batch, given a dense layer's
    forward and backward collectives' seconds: the layer's share of them (``moe_layer_share``)
    and its recomputed share of the forward's (``recomputed_forward_share``)."""
    share = moe_layer_share(model, layout) if moe else 1.0
    again = recomputed_forward_share(model, layout, moe=moe, selective=selective)
    return share * (forward_s + backward_s) + again * forward_s


def recomputed_forward_share(
    model: ModelSpec, layout: Layout, *, moe: bool, selective: SelectiveRecompute = SelectiveRecompute.MODULES
) -> float:
    """The share of a dense layer's forward collectives a dense (MoE) layer runs again in its
    backward: all it runs under full recomputation; under selective, its MLP's (MoE block's) half
    where ``mlp`` (``moe``) is recomputed, the MoE block's being what the layer runs beyond
    attention's half (``moe_layer_share``: none when folded without shared experts); else none.
    Under torchtitan's per-op policy (``selective``) a dense layer without latent attention runs
    its all-gathers again, half its forward's collectives with sequence parallelism (the
    reduce-scatters' outputs are kept), and its all-reduces, all of them, without."""
    share = moe_layer_share(model, layout) if moe else 1.0
    if layout.recompute is Recompute.FULL:
        return share
    per_op = selective is SelectiveRecompute.EVERY_OTHER_MATMUL and per_op_priced(model, moe=moe)
    if layout.recompute is Recompute.SELECTIVE and per_op:
        return 0.5 if layout.sequence_parallel else 1.0
    block = RecomputeModule.MOE if moe else RecomputeModule.MLP
    return share - 0.5 if layout.recomputes(block) else 0.0


def moe_layer_share(model: ModelSpec, layout: Layout) -> float:
    """An MoE layer's tensor-parallel time over a dense layer's (``tensor_parallel_layer_s``): 1
    with the experts split over t; folded, 1/2 (attention's collectives alone), or 1 with shared
    experts, which keep the MLP's collectives (module docstring)."""
    if not layout.folds_experts or model.shared_ffn_size:
        return 1.0
    return 0.5


def tensor_parallel_forward_backward_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    tensor_groups: Iterable[Group],
    local: tuple[float, float] | None,
) -> tuple[float, float]:
    """Forward and backward tensor-parallel seconds of one layer: measured beyond ``local``, or
    else the collectives priced over the tensor-parallel groups."""
    t = layout.tensor_parallel_degree
    if t == 1:
        return 0.0, 0.0
    if local is not None:
        real = measured_layer_s(
            cluster.pricing_device,
            model.name,
            training.precision.weights,
            t,
            layout.micro_batch_size,
            training.seq_len,
            sequence_parallel=layout.sequence_parallel,
        )
        if real is not None:
            moved = _relinked_s(model, training, cluster, layout, tensor_groups)
            return max(0.0, real[0] - local[0] + moved), max(0.0, real[1] - local[1] + moved)
    groups = priced_groups(tensor_groups, cluster, rank_order=layout.device_map.is_identity)
    backward = _collectives_s(model, training, cluster, layout, groups)
    return _collectives_s(model, training, cluster, layout, groups, forward=True), backward


def _collectives_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    groups: tuple[Group, ...],
    *,
    forward: bool = False,
) -> float:
    """One pass's (forward or backward) tensor-parallel collectives of a layer over ``groups``,
    priced from the links: the slowest group's, each over the rank's s b h activations in
    ``Precision.activation_communication``; the forward's sequence-parallel all-gathers (of the
    QKV and MLP inputs) in ``Precision.sequence_gather`` (FP8 under the recipes that gather the
    quantized input)."""
    precision = training.precision
    elements = layout.micro_batch_size * local_seq_len(training, layout) * model.hidden_size
    act_bytes = elements * precision.activation_communication.bytes
    if layout.sequence_parallel:
        gathered_bytes = elements * precision.sequence_gather.bytes if forward else act_bytes
        return 2 * (
            slowest_collective_s(CollectiveOp.ALL_GATHER, gathered_bytes, groups, cluster)
            + slowest_collective_s(CollectiveOp.REDUCE_SCATTER, act_bytes, groups, cluster)
        )
    return 2 * slowest_collective_s(CollectiveOp.ALL_REDUCE, act_bytes, groups, cluster)


def _relinked_s(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, tensor_groups: Iterable[Group]
) -> float:
    """Seconds a measured layer's pass gains (or loses) on ``tensor_groups`` against the groups
    the profiler timed it on, every t consecutive devices of the cluster (module docstring): 0
    on uniform links, where every group of a shape prices alike."""
    if has_uniform_links(cluster):
        return 0.0
    t = layout.tensor_parallel_degree
    timed = priced_groups(
        (Group(range(first, first + t)) for first in range(0, cluster.world_size - t + 1, t)), cluster, rank_order=True
    )
    priced = priced_groups(tensor_groups, cluster, rank_order=layout.device_map.is_identity)
    return _collectives_s(model, training, cluster, layout, priced) - _collectives_s(
        model, training, cluster, layout, timed
    )
