"""Offload to host memory: what the offloaded share of a rank's optimizer shard
(``Layout.optimizer_offload_fraction``), under ZeRO-3 its weight and gradient shards
(``Layout.parameter_offload``), and some layers' activations (``Layout.activation_offload_layers``)
take from the device, fill of the host and add to the step.

What runs where is Megatron-Core's hybrid device optimizer and DeepSpeed's ZeRO-Offload alike:
of the parameters whose optimizer step a rank runs (``sharding.optimizer_shard_params``) a
fraction f keeps its fp32 master weights and Adam moments (``Precision.optimizer_bytes_per_param``)
in pinned host memory, with an fp32 copy of its gradients (``Precision.gradient_accumulation``;
DeepSpeed's ``stage_1_and_2`` casts each partition to fp32 before its copy, Megatron-Core's
``HybridDeviceOptimizer`` keeps pinned fp32 gradient buffers). Each step copies those gradients
to the host, the host's CPUs run Adam on them, and the updated weights come back in the
training precision (``Precision.weights``; the ZeRO-Offload paper, sec. 3.3: 2 bytes down and
2 up per parameter at fp16, here 4 down as both frameworks copy). The device keeps the rest,
1 - f, and under ZeRO-3 in mixed precision, where the fp32 shard was the weights'
only sharded copy (``sharding.fsdp_model_states``), a training-precision copy of the offloaded
share's weights (DeepSpeed's fp16 partition beside the CPU master). Megatron-Core keeps the fp32
master of the offloaded share on the device as well, moving only the moments off it
(``offloaded_states_share``, ``Stack.offloads_master_weights``).

Time, on the step's critical path after the backward, in series (``optimizer_offload_s``): the
copies down and up at each device's pinned rates with every device of its node copying at once
(``DeviceProfile.device_to_host_bytes_per_s``, ``host_to_device_bytes_per_s``), and Adam at the
node's rate (``HostProfile.adam_params_per_s``), which every rank of the node shares. Megatron-Core
overlaps the copies with the CPU step only under ``--overlap-cpu-optimizer-d2h-h2d`` (off by
default), which recovered about 7% of the offloaded step in Megatron-Bridge's measurements, where
the CPU's Adam, not the copies, dominated; DeepSpeed copies at the accumulation boundary, after
the backward. No stack overlaps the CPU's step with the next step's forward by default
(ZeRO-Offload's one-step-delayed update is an option, not priced).

With the weights offloaded too (FSDP2's ``CPUOffloadPolicy``, DeepSpeed's ``offload_param``) the
device holds only the units it gathers; the shards cross at every unshard and every reduced
gradient (``optimizer_offload_s`` says which of those copies the step waits for).

Activations (``Layout.activation_offload_layers``, one stage, no recompute): what the offloaded
layers keep for their backward lives on the host (``stage_activations``), copied down in each
micro-batch's forward and up in its backward (``activation_offload_s``), behind the compute where
the stack copies on a side stream, in series with it where it does not.

Host memory per node is the busiest stage's host bytes times the ranks of a node (an upper
bound where a node holds ranks of several stages), beside ``HostProfile.memory_bytes``.
Units: parameters (elements), bytes, seconds.
"""

from cost_models.params import StageParams, all_stage_params
from cost_models.sharding import held_zero_stage, optimizer_shard_params
from planner.schemas import (
    ClusterProfile,
    HostProfile,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    Precision,
    Stack,
    ZeroStage,
)


def offloaded_params(params: StageParams, layout: Layout) -> float:
    """Parameters of a rank holding ``params`` whose optimizer states live on the host: the
    offloaded fraction of its optimizer shard (elements)."""
    fraction = layout.optimizer_offload_fraction
    return fraction * optimizer_shard_params(params, layout) if fraction > 0 else 0.0


def host_bytes_per_param(precision: Precision) -> float:
    """Host bytes per offloaded parameter: its optimizer states (fp32 master and two moments in
    mixed precision) and the fp32 gradient it is stepped with."""
    return precision.optimizer_bytes_per_param + precision.gradient_accumulation.bytes


def rank_host_bytes(params: StageParams, layout: Layout, precision: Precision) -> float:
    """Host bytes of one rank holding ``params``: its offloaded parameters' optimizer states and
    fp32 gradients (``host_bytes_per_param``), and under ``Layout.parameter_offload`` in fp32
    training the weights themselves (in mixed precision the fp32 master among the states is the
    sharded weights FSDP2 keeps)."""
    per_param = host_bytes_per_param(precision)
    if layout.parameter_offload and not precision.mixed:
        per_param += precision.weights.bytes
    return offloaded_params(params, layout) * per_param


def _busiest_stage(model: ModelSpec, layout: Layout) -> StageParams:
    """The parameters of the stage whose rank offloads the most (every rank of it offloads alike)."""
    return max(set(all_stage_params(model, layout)), key=lambda p: offloaded_params(p, layout))


def offloaded_states_share(precision: Precision, stack: Stack) -> float:
    """Of a parameter's optimizer states, the share an offload takes off the device: all of them,
    or under a stack that keeps the fp32 master on the device (``Stack.offloads_master_weights``:
    Megatron-Core's) the moments alone, 8 of 12 bytes in mixed precision."""
    if stack.offloads_master_weights or precision.master_weight_bytes_per_param == 0:
        return 1.0
    return 1.0 - precision.master_weight_bytes_per_param / precision.optimizer_bytes_per_param


def offloaded_weight_copy_bytes(params: StageParams, layout: Layout, precision: Precision) -> float:
    """Device bytes a rank adds for the offloaded share's weights: under ZeRO-3 in mixed precision
    the fp32 master was the shard's only copy (``sharding.fsdp_model_states``), so the offloaded
    share keeps one in ``Precision.weights``; otherwise the rank holds those weights already."""
    if held_zero_stage(layout) is not ZeroStage.PARAMETERS or not precision.mixed or layout.shard_degree == 1:
        return 0.0
    return precision.weights.bytes * offloaded_params(params, layout)


def ranks_per_node(cluster: ClusterProfile, layout: Layout) -> int:
    """Ranks that share one node's host: a node's devices, or the world where it is smaller."""
    return min(cluster.devices_per_node, layout.world_size)


def host_memory_per_node_bytes(memories: tuple[MemoryBreakdown, ...], cluster: ClusterProfile, layout: Layout) -> float:
    """Host bytes the busiest node fills: the busiest stage's host bytes per rank
    (``MemoryBreakdown.host_bytes`` of ``memories``, every stage's) times the ranks of a node
    (module docstring); 0 without offload."""
    return max(m.host_bytes for m in memories) * ranks_per_node(cluster, layout)


def optimizer_offload_s(
    model: ModelSpec,
    cluster: ClusterProfile,
    layout: Layout,
    precision: Precision,
    *,
    micro_batches: int = 1,
    compute_per_micro_batch_s: float = 0.0,
) -> float:
    """Seconds of the host's part of the step on the slowest stage (module docstring): the
    gradients down, the node's CPUs' Adam over its ranks' offloaded shares, the weights up; 0
    without offload. Under ``Layout.parameter_offload`` (FSDP2's ``CPUOffloadPolicy``) the weights
    go up at every unshard instead, twice a micro-batch (forward, and backward after the forward
    resharded), prefetched with the all-gathers behind the micro-batch's compute
    (``compute_per_micro_batch_s``): only what exceeds it counts; each micro-batch's reduced
    gradient shard goes down, hidden but where it is accumulated into the one before (micro-batches
    2..m), which FSDP2 copies synchronously (``foreach_reduce``: "only overlap the D2H copy ... if
    not accumulating gradients"; the host's add is not priced). ``layout_validity.check_offload``
    must have accepted the cluster."""
    if layout.optimizer_offload_fraction <= 0:
        return 0.0
    host = cluster.host
    assert isinstance(host, HostProfile)
    down = min(d.device_to_host_bytes_per_s or 0.0 for d in cluster.devices)
    up = min(d.host_to_device_bytes_per_s or 0.0 for d in cluster.devices)
    per_rank = offloaded_params(_busiest_stage(model, layout), layout)
    cpu_s = per_rank * ranks_per_node(cluster, layout) / host.adam_params_per_s
    if layout.parameter_offload:
        shard_bytes = 4 if precision.mixed else precision.weights.bytes  # FSDP2's sharded fp32 master, or the weights
        unshards_s = 2 * per_rank * shard_bytes / up
        accumulated_s = (micro_batches - 1) * per_rank * precision.gradient_accumulation.bytes / down
        return micro_batches * max(0.0, unshards_s - compute_per_micro_batch_s) + accumulated_s + cpu_s
    copies_s = per_rank * (precision.gradient_accumulation.bytes / down + precision.weights.bytes / up)
    return copies_s + cpu_s


def activation_offload_s(
    offloaded_bytes: float,
    cluster: ClusterProfile,
    layout: Layout,
    stack: Stack,
    *,
    layers: int,
    micro_batches: int,
    compute_per_micro_batch_s: float,
) -> float:
    """Seconds an activation offload (``Layout.activation_offload_layers``) adds to the step:
    each micro-batch's ``offloaded_bytes`` (``stage_activations.offloaded_activation_bytes``) go
    down in the forward and come up in the backward, at every device's pinned copy rates with all
    of them copying at once. Under a stack that copies on a side stream
    (``Stack.overlaps_activation_offload``) the copies hide behind the offloaded layers' own
    compute, a third of it forward, two thirds backward (of ``compute_per_micro_batch_s`` of the
    stage's ``layers``, every layer alike): only what exceeds it counts; otherwise they run in
    series with it. ``layout_validity.check_offload`` must have accepted the cluster."""
    if offloaded_bytes <= 0:
        return 0.0
    down_s = offloaded_bytes / min(d.device_to_host_bytes_per_s or 0.0 for d in cluster.devices)
    up_s = offloaded_bytes / min(d.host_to_device_bytes_per_s or 0.0 for d in cluster.devices)
    if stack.overlaps_activation_offload:
        covered_s = compute_per_micro_batch_s * layout.activation_offload_layers / layers
        return micro_batches * (max(0.0, down_s - covered_s / 3) + max(0.0, up_s - 2 * covered_s / 3))
    return micro_batches * (down_s + up_s)
