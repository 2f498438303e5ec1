"""`planner estimate`: one layout's predicted memory and step time, and the figures beside it."""

from pathlib import Path

from cost_models.estimate import estimate as _estimate
from cost_models.expert_parallel import dropped_share
from cost_models.stage_devices import stage_devices, uniformly_slowest
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.flows.loading import cluster_of, model_for, routing_of
from planner.schemas import ClusterProfile, Estimate, Layout, ModelSpec, TrainingSpec
from planner.schemas.layout import check_experts


def estimate(
    model: ModelSpec | str,
    cluster: ClusterProfile | str,
    training: TrainingSpec,
    layout: Layout,
    *,
    routing_trace: Path | str | None = None,
) -> Estimate:
    """Predict per-rank memory and step time of ``layout`` for ``model`` on ``cluster``.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` (``dgx-a100-80g:16``) or a profile path.
        training: global batch (sequences), sequence length (tokens), precision, optimizer.
        layout: parallel degrees, ZeRO stage, micro-batch, recompute, schedule.
        routing_trace: a routing trace file of an MoE model: its MoE layers are priced at their
            busiest expert-parallel rank under the layout's placement; None assumes uniform routing.

    Returns:
        The Estimate: seconds per step, tokens/s, FLOPs, MFU, bytes per rank by category.

    Raises:
        SchemaError: an input could not be read or is invalid, or the sequence is longer than the
            model allows (``ModelSpec.max_seq_len``).
        InfeasibleConfigError: the layout does not divide the model, batch or cluster.
    """
    model_spec = model_for(model, training)
    cluster_profile = cluster_of(cluster)
    check_experts(model_spec, layout)  # first: its messages say which expert-parallel degrees would do
    routing = routing_of(routing_trace, model_spec)
    return _estimate(model_spec, training, cluster_profile, layout, routing=routing)


def homogeneous_estimate(
    model: ModelSpec | str, cluster: ClusterProfile | str, training: TrainingSpec, layout: Layout
) -> Estimate:
    """``layout`` priced with every rank of ``cluster`` as its slowest device with the smallest
    memory: the homogeneous treatment of a mixed cluster, against which pricing each stage on its
    own devices is measured (the estimate itself on a cluster of one device type).

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` or a profile path, of one or several
            device types.
        training: global batch (sequences), sequence length (tokens), precision, optimizer.
        layout: parallel degrees, ZeRO stage, micro-batch, recompute, schedule.

    Returns:
        The Estimate on the cluster's slowest device everywhere.

    Raises:
        SchemaError: an input could not be read or is invalid.
        InfeasibleConfigError: the layout does not divide the model, batch or cluster.
    """
    profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return _estimate(model_for(model, training), training, uniformly_slowest(profile), layout)


def stage_device_names(cluster: ClusterProfile | str, layout: Layout) -> tuple[str, ...]:
    """The device type that prices each pipeline stage of ``layout`` on ``cluster``, in pipeline
    order: its ranks' own, the slowest of them where a stage spans several
    (``cost_models.stage_devices``).

    Args:
        cluster: a ClusterProfile, a preset ``NAME:NODES`` or a profile path.
        layout: the layout whose stages are placed.

    Returns:
        One device name per pipeline stage.

    Raises:
        SchemaError: the cluster cannot be read.
    """
    profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return tuple(device.name for device in stage_devices(profile, layout))


def dropped_token_share(
    model: ModelSpec | str, training: TrainingSpec, routing_trace: Path | str | None = None
) -> float:
    """Share of the routed (token, expert) pairs that ``training``'s capacity factor drops
    (``cost_models.expert_parallel.dropped_share``).

    Args:
        model: a preset name or a model spec.
        training: its ``moe_capacity_factor`` (None: dropless) and ``moe_pad_to_capacity``.
        routing_trace: a routing trace file of the model; None assumes uniform routing.

    Returns:
        The dropped share of all routed pairs, over the MoE layers: 0 dropless, padded, or for a
        dense model.

    Raises:
        SchemaError: an unknown model, or a trace that cannot be read or is of another model.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    return dropped_share(model_spec, training, routing_of(routing_trace, model_spec))
