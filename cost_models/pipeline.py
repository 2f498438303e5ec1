"""Pipeline parallelism's step cost: the bubble, the transfers between stages, the schedule's own
bookkeeping, and when sharded gradients are reduced. (The split of layers into chunks and the
micro-batches in flight are layout geometry: ``schemas.geometry``.)

Sources: Narayanan et al. (SC21) sec. 2.2 for bubble fractions (p-1)/m and (p-1)/(v m), and
sec. 3 for the transfers: an activation forward and a gradient backward per micro-batch and
model chunk, and 2 (p - 1) more while the pipeline fills and drains, over the boundary links;
under tensor parallelism each rank sends its 1/t slice (Megatron-LM's scatter/gather). Where the
profile timed a tiny schedule's slot, what it took beyond its two transfers (the schedule's
bookkeeping) is added once per slot of the critical path (``micro_batch_slots``).

Send/receive overlap (``TrainingSpec.pp_comm_overlap``; Megatron-LM's --overlap-p2p-communication,
on by default and effective with virtual stages; Megatron Bridge turns it on exactly when there are
virtual stages and batches the transfers otherwise): in an interleaved schedule's steady state each
chunk posts the next chunk's receive and its own send before it computes, so the 2 m v transfers run
behind the m v chunks' compute, at the cost any overlap has (``overlap.overlapped_comm_cost_s``);
the 2 (p - 1) transfers that fill and drain the pipeline have no compute beside them and stay
exposed. Without virtual stages, or on a CPU (``overlap.hides_communication``), every transfer is
on the critical path.

ZeRO 2-3 under a pipeline (``defers_gradient_reduction``): torch.distributed.pipelining runs
every backward of a sharded (FSDP) stage without gradient sync and without resharding, and
reduce-scatters once, after the stage's last backward (PipelineStage.perform_reduce_grad; as
torchtitan runs pipeline with FSDP). The stage then holds its whole gradient during the step
and, after each backward, its gathered weights: ZeRO 2-3 save only the optimizer shard, as
ZeRO-1 does (DeepSpeed refuses ZeRO 2-3 with a pipeline; Megatron-LM offers ZeRO-1 alone).
Measured on tiny-gpt, dp 2 x pp 2, 8 micro-batches: each unit reduce-scattered once a step,
gathered once under ZeRO-2 and 9 (m + 1) times under ZeRO-3 (``cost_models.sharding``).
Units: seconds, bytes.
"""

import numpy as np

from cost_models import groups as grp
from cost_models.comm import device_link, first_rows, has_uniform_links, transfer_time_s
from cost_models.compute import measured_pipeline_slot_s
from cost_models.context_parallel import local_seq_len
from cost_models.memo import HeldMemo
from cost_models.overlap import hides_communication, overlapped_comm_cost_s
from planner.schemas import ClusterProfile, Layout, LinkProfile, ModelSpec, Schedule, TrainingSpec
from planner.schemas.geometry import pipeline_schedules


def bubble_fraction(layout: Layout, micro_batches: int) -> float:
    """Idle share of the ideal step: (p - 1) / m, or (p - 1) / (v m) interleaved."""
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    return (p - 1) / (v * micro_batches)


def bubble_s(layout: Layout, micro_batches: int, slowest_stage_s: float, flushes: int = 1) -> float:
    """Seconds the pipeline idles per step: the bubble fraction of m micro-batches on the slowest
    stage (``slowest_stage_s`` seconds each; SC21 sec. 2.2); run as ``flushes`` schedules of m / f
    micro-batches each (``TrainingSpec.pipeline_flushes``), every one fills and drains the
    pipeline: f (p - 1) stage times, f times the one schedule's."""
    per_schedule = micro_batches // flushes
    return flushes * bubble_fraction(layout, per_schedule) * per_schedule * slowest_stage_s


def micro_batch_slots(layout: Layout, micro_batches: int, flushes: int = 1) -> int:
    """Units of the schedule's critical path: m, or with p > 1 stages m x v chunk steps plus the
    p - 1 that fill the pipeline, once per schedule of the step's ``flushes``."""
    p = layout.pipeline_parallel_degree
    return micro_batches if p == 1 else micro_batches * layout.virtual_stages + flushes * (p - 1)


def pipeline_comm_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    micro_batches: int,
    stage_compute_s: float = 0.0,
) -> float:
    """Point-to-point time of one step on the critical path, with the schedule's own cost per slot
    where the profile timed it (module docstring); 0 without a pipeline.

    Args:
        model: hidden size of the activations sent.
        training: sequence length and precision; whether sends and receives overlap compute.
        cluster: links between stages, and the profiled pipeline slot if any.
        layout: degrees, micro-batch size, virtual stages, device map.
        micro_batches: micro-batches per step on one replica (m).
        stage_compute_s: the slowest stage's compute per micro-batch (all its chunks, recompute
            included): what overlapped transfers run behind.

    Returns:
        Seconds: (2 m v + 2 f (p - 1)) hops over the slowest stage boundary (f the training's
        ``pipeline_flushes``, each filling and draining the pipeline), the 2 m v behind compute
        where they overlap it, plus per slot what the profiled slot took beyond its two
        transfers' latency.
    """
    p, v, t = layout.pipeline_parallel_degree, layout.virtual_stages, layout.tensor_parallel_degree
    if p == 1:
        return 0.0
    tokens = layout.micro_batch_size * local_seq_len(training, layout)  # the rank's share under context parallelism
    act_bytes = tokens * model.hidden_size * training.precision.activation_communication.bytes / t
    # With uniform links of each class a hop costs what its crossing or not of nodes does. In rank
    # order every (replica, shard) crosses nodes at the same stages, so the first pipeline's
    # boundaries stand for all; not its first boundary alone: with d t below a node's devices
    # the pipeline leaves a node at some boundaries only.
    rank_order = has_uniform_links(cluster) and layout.device_map.is_identity
    # The distinct links the hops cross (few: a hop's link is read once, its time once per link).
    links = _LINKS.get(
        cluster, (grp.mesh_key(layout), rank_order), lambda: _boundary_links(cluster, layout, rank_order)
    )
    hop_s = max(transfer_time_s(act_bytes, link) for link in links)
    flushes = pipeline_schedules(layout, training.pipeline_flushes)
    steady_s, fill_drain_s = 2 * micro_batches * v * hop_s, 2 * flushes * (p - 1) * hop_s
    if overlaps_transfers(training, cluster, layout):
        steady_s = overlapped_comm_cost_s(steady_s, micro_batches * stage_compute_s)
    transfers_s = steady_s + fill_drain_s
    slot_s = measured_pipeline_slot_s(cluster.pricing_device)
    if slot_s is None:
        return transfers_s
    # The schedule's own cost: the tiny slot beyond its two transfers.
    latency_s = max(link.latency_s for link in links)
    return transfers_s + micro_batch_slots(layout, micro_batches, flushes) * max(0.0, slot_s - 2 * latency_s)


_LINKS: HeldMemo[frozenset[LinkProfile]] = HeldMemo(limit=4096)
"""The distinct links a mesh's stage boundaries cross, per cluster (a search's layouts share few meshes)."""


def _boundary_links(cluster: ClusterProfile, layout: Layout, first_pipeline_only: bool) -> frozenset[LinkProfile]:
    """The links between consecutive stages of every pipeline, or of the first: of one pair of each
    kind, where nodes fall into classes (a link reads the two nodes' classes, whether they are one
    node, and the two local indices), else of every distinct pair."""
    devices = grp.pipeline_groups(layout).device_array()
    if first_pipeline_only:
        devices = devices[:1]
    src, dst = devices[:, :-1].ravel(), devices[:, 1:].ravel()
    per_node, classes = cluster.devices_per_node, cluster.node_classes
    if classes is None:
        kinds = np.stack([src, dst], axis=1)
    else:
        of = np.asarray(classes, dtype=np.int64)
        src_node, dst_node = src // per_node, dst // per_node
        kinds = np.stack([of[src_node], of[dst_node], src_node == dst_node, src % per_node, dst % per_node], axis=1)
    first = first_rows(kinds.astype(np.int64))
    return frozenset(device_link(cluster, int(src[i]), int(dst[i])) for i in first)


def overlaps_transfers(training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> bool:
    """Whether the steady state's sends and receives run behind compute (module docstring): asked
    for, an interleaved schedule, on a device that hides communication."""
    return training.pp_comm_overlap and layout.schedule is Schedule.INTERLEAVED and hides_communication(cluster)


def defers_gradient_reduction(layout: Layout) -> bool:
    """Whether sharded gradients are kept whole and reduced once a step, after the last backward:
    ZeRO 2-3 with a pipeline and data-parallel peers (module docstring)."""
    return layout.pipeline_parallel_degree > 1 and layout.dense_replicas > 1 and layout.zero_stage.shards_gradients
