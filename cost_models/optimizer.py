"""The optimizer step's time: Adam over the parameters whose states a rank holds.

Adam reads and writes 28 bytes per parameter of the rank's optimizer shard in one fused pass (fp32
weight, two moments, gradient, and the training-precision copy), 78 in eager kernels
(``kernels.adam_bytes_per_param``), memory-bound; or it runs at the rate the
profiler timed on the model's own layer (``compute.measured_optimizer_s``). Under ZeRO 1-3 the
shard is 1/d of the dense parameters and 1/(d / ep) of the experts' (d t / ep folded: ``sharding``), less
the share a layout offloads to the host, whose step is ``cost_models.offload``'s. Every
pipeline stage steps at once; the step waits for the slowest. Units: seconds, bytes.
"""

from cost_models.compute import elementwise_time_s, measured_optimizer_s
from cost_models.kernels import adam_bytes_per_param
from cost_models.params import all_stage_params
from cost_models.sharding import optimizer_shard_params
from planner.schemas import ClusterProfile, DType, Kernels, Layout, ModelSpec


def optimizer_step_s(
    model: ModelSpec, cluster: ClusterProfile, layout: Layout, kinds: Kernels, *, weights_dtype: DType
) -> float:
    """Seconds of one optimizer step on the slowest pipeline stage.

    Args:
        model: the model (the stages' parameters; its name for the profiled rate).
        cluster: the device (memory bandwidth, profiled optimizer record).
        layout: degrees and ZeRO stage.
        kinds: fused or eager kernels (``TrainingSpec.kernels``).
        weights_dtype: the parameters' precision (``Precision.weights``), whose profiled step is read.

    Returns:
        The largest stage's optimizer time, in seconds.
    """
    optimizer_s = 0.0
    for held in set(all_stage_params(model, layout)):
        params = optimizer_shard_params(held, layout) * (1.0 - layout.optimizer_offload_fraction)
        measured = measured_optimizer_s(cluster.pricing_device, model.name, params, weights_dtype)
        stage_s = (
            measured
            if measured is not None
            else elementwise_time_s(adam_bytes_per_param(kinds) * params, cluster.pricing_device)
        )
        optimizer_s = max(optimizer_s, stage_s)
    return optimizer_s
