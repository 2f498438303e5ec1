"""The inputs every planning flow loads the same way: a model where it meets the training, a
cluster (and a note on how a cluster of mixed devices is priced), a routing trace."""

import logging
from pathlib import Path

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.routing_trace import load_routing_stats
from planner.schemas import ClusterProfile, ModelSpec, RoutingStats, TrainingSpec
from planner.schemas.model import check_seq_len

logger = logging.getLogger(__name__)


def model_for(model: ModelSpec | str, training: TrainingSpec) -> ModelSpec:
    """The model (loaded if named) where it meets the training: every estimate and search (and so
    every tune and plan) passes here, and a sequence longer than the model allows stops here.

    Raises:
        SchemaError: the model cannot be read, or ``training.seq_len`` exceeds ``max_seq_len``.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    check_seq_len(model_spec, training.seq_len)
    return model_spec


def cluster_of(cluster: ClusterProfile | str) -> ClusterProfile:
    """The cluster (loaded if named), with one line saying how mixed device types are priced.

    Raises:
        SchemaError: the cluster cannot be read.
    """
    profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if profile.has_mixed_devices:
        logger.info(
            "note: %s mixes %s; each pipeline stage is priced on its own ranks' devices, a stage spanning "
            "several types as the slowest (%s) with the smallest memory (%.1f GB)",
            profile.name,
            " and ".join(d.name for d in profile.devices),
            profile.pricing_device.name,
            profile.pricing_device.memory_bytes / 1e9,
        )
    return profile


def routing_of(routing_trace: Path | str | None, model: ModelSpec) -> RoutingStats | None:
    """The statistics of an optional routing trace of ``model`` (``planner.files.routing_trace``)."""
    return load_routing_stats(routing_trace, model) if routing_trace is not None else None
