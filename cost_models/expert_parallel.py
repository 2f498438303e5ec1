"""Expert parallelism's time per layer and micro-batch: moving tokens to their experts and back.

An MoE layer sends each micro-batch's routed tokens (k per token) to the experts with an
all-to-all and back with another, forward and again backward (GShard, Lepikhin et al. 2020;
Megatron-LM's token dispatcher); full recomputation repeats the forward's two. Units: seconds,
bytes.
"""

from collections.abc import Iterable

from cost_models.comm import Group, slowest_collective_s
from planner.schemas import ClusterProfile, CollectiveOp, Layout, ModelSpec, Recompute, TrainingSpec


def expert_parallel_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    expert_groups: Iterable[Group],
) -> float:
    """Expert-parallel seconds of one MoE layer and micro-batch; 0 for a dense model or ep = 1.

    Args:
        model: hidden size, experts per token.
        training: sequence length and precision.
        cluster: links and collective records.
        layout: expert-parallel degree, micro-batch size, recompute.
        expert_groups: the expert-parallel groups (devices).

    Returns:
        Seconds: 4 all-to-alls of k s b h elements (6 under full recomputation).
    """
    if not (model.is_moe and layout.expert_parallel_degree > 1):
        return 0.0
    routed = layout.micro_batch_size * training.seq_len * model.num_experts_per_tok
    a2a_bytes = routed * model.hidden_size * training.dtype.bytes
    a2a_s = slowest_collective_s(CollectiveOp.ALL_TO_ALL, a2a_bytes, expert_groups, cluster)
    return (4 + (2 if layout.recompute is Recompute.FULL else 0)) * a2a_s
