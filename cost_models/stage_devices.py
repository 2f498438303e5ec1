"""Which devices price each pipeline stage, on a cluster of mixed device types.

A stage's ranks run each micro-batch in lockstep (tensor-parallel collectives inside it, the
data-parallel gradient reduction across its replicas), so a stage runs at the pace of the
slowest device among its ranks and fits in the smallest memory among them
(``schemas.cluster.slowest_device``). Its ranks are a contiguous block of the rank order
(``schemas.geometry``), placed by the layout's ``DeviceMap``; with the identity map on
``dgx-a100-80g:2+dgx-h100:2`` and pp 2, stage 0 holds the A100 nodes and stage 1 the H100 ones.
A stage is priced on ``ClusterProfile.priced_on`` its device: the cluster's own links and
collective curves with that device everywhere. On a cluster of one device type every stage is
priced on the cluster itself, as before.
"""

from cost_models.memo import HeldMemo
from planner.schemas import ClusterProfile, DeviceProfile, DType, Layout
from planner.schemas.cluster import slowest_device
from planner.schemas.geometry import mesh_shape

_DEVICES: HeldMemo[tuple[DeviceProfile, ...]] = HeldMemo(limit=4096)
_VIEWS: HeldMemo[ClusterProfile] = HeldMemo(limit=256)


def stage_devices(cluster: ClusterProfile, layout: Layout) -> tuple[DeviceProfile, ...]:
    """The device that prices each pipeline stage of ``layout``, in pipeline order: the slowest
    among its ranks' devices with the smallest memory; ``pricing_device`` for every stage on a
    cluster of one device type."""
    p, d, t = mesh_shape(layout)
    if not cluster.has_mixed_devices:
        return (cluster.pricing_device,) * p
    key = (p, d * t, layout.device_map)
    return _DEVICES.get(cluster, key, lambda: _stage_devices(cluster, layout))


def _stage_devices(cluster: ClusterProfile, layout: Layout) -> tuple[DeviceProfile, ...]:
    p, d, t = mesh_shape(layout)
    per_stage, per_node = d * t, cluster.devices_per_node
    out: list[DeviceProfile] = []
    for s in range(p):
        nodes = {layout.device_map.device_of(r) // per_node for r in range(s * per_stage, (s + 1) * per_stage)}
        kinds: list[DeviceProfile] = []
        for node in sorted(nodes):
            device = cluster.node_device(node)
            if device not in kinds:
                kinds.append(device)
        device = slowest_device(tuple(kinds))
        # one object per distinct device (the pricing device's own where equal), so that callers group by identity
        out.append(next((seen for seen in (cluster.pricing_device, *out) if seen == device), device))
    return tuple(out)


def mean_peak_flop_per_s(cluster: ClusterProfile, layout: Layout, gemm_dtype: DType) -> float:
    """The mean peak FLOP/s in ``gemm_dtype`` (``Precision.gemm_inputs``) of ``layout``'s ranks,
    each on its own node's device: MFU divides by the world size times this (the device's peak on
    a cluster of one type). A device map permutes devices 0..world-1, so the ranks run on those
    whichever the map: the mean is over them, node by node."""
    if not cluster.has_mixed_devices:
        return cluster.pricing_device.get_peak_flop_per_s(gemm_dtype)
    return _MEAN_PEAKS.get(
        cluster, (layout.world_size, gemm_dtype), lambda: _mean_peak(cluster, layout.world_size, gemm_dtype)
    )


_MEAN_PEAKS: HeldMemo[float] = HeldMemo(limit=256)


def _mean_peak(cluster: ClusterProfile, world: int, gemm_dtype: DType) -> float:
    per_node = cluster.devices_per_node
    total = sum(
        min(per_node, world - node * per_node) * cluster.node_device(node).get_peak_flop_per_s(gemm_dtype)
        for node in range(-(-world // per_node))
    )
    return total / world


def priced_on(cluster: ClusterProfile, device: DeviceProfile) -> ClusterProfile:
    """``cluster`` with ``device`` on every node (``ClusterProfile.priced_on``); the cluster itself
    when that is already how it is priced. One object per (cluster, device), so that the cost
    model's memos keyed on the pricing device hit."""
    if device is cluster.pricing_device or not cluster.has_mixed_devices:
        return cluster
    key = (device.name, device.memory_bytes, *sorted(device.peak_flop_per_s.items()), device.matmul)
    return _VIEWS.get(cluster, key, lambda: cluster.priced_on(device))


def uniformly_slowest(cluster: ClusterProfile) -> ClusterProfile:
    """``cluster`` with every rank priced as its slowest device with the smallest memory (the
    homogeneous treatment of a mixed cluster): what a planner blind to the mix prices."""
    return cluster.priced_on(cluster.pricing_device) if cluster.has_mixed_devices else cluster
