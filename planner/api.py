"""The planner's Python API: what the CLI calls, and what users import.

>>> import planner
>>> est = planner.estimate("llama3-8b", "dgx-h100:1", planner.TrainingSpec(global_batch_size=64, seq_len=8192),
...                        planner.Layout(data_parallel_degree=8, tensor_parallel_degree=1,
...                                       pipeline_parallel_degree=1, micro_batch_size=1, zero_stage=1))
"""

from cost_models.estimate import estimate as _estimate
from planner.inputs import load_cluster, load_model
from planner.plans import load_plan, save_plan
from planner.schemas import ClusterProfile, Estimate, Layout, ModelSpec, TrainingSpec

__all__ = ["estimate", "load_cluster", "load_model", "load_plan", "save_plan"]


def estimate(model: ModelSpec | str, cluster: ClusterProfile | str, training: TrainingSpec, layout: Layout) -> Estimate:
    """Predict per-rank memory and step time of ``layout`` for ``model`` on ``cluster``.

    Args:
        model: a ModelSpec, a preset name (``llama3-8b``) or a config.json/YAML path.
        cluster: a ClusterProfile, a preset ``NAME:NODES`` (``dgx-a100-80g:16``) or a profile path.
        training: global batch (sequences), sequence length (tokens), dtype, optimizer.
        layout: parallel degrees, ZeRO stage, micro-batch, recompute, schedule.

    Returns:
        The Estimate: seconds per step, tokens/s, FLOPs, MFU, bytes per rank by category.

    Raises:
        SchemaError: an input could not be read or is invalid.
        InfeasibleConfigError: the layout does not divide the model, batch or cluster.
    """
    model_spec = load_model(model) if isinstance(model, str) else model
    cluster_profile = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return _estimate(model_spec, training, cluster_profile, layout)
