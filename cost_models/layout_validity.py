"""Whether a layout can run a model at all: divisibility and world-size checks.

Each failure raises InfeasibleConfigError naming the values and what would fix them. Memory
fit is not checked here: the Estimate says whether the layout fits.
"""

from planner.schemas import (
    ClusterProfile,
    ContextParallelKind,
    DeviceKind,
    DType,
    Layout,
    ModelSpec,
    Schedule,
    TrainingSpec,
)
from planner.schemas.context_split import check_context_split
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import chunk_layers, pipeline_schedules, stage_layers
from planner.schemas.layout import check_experts


def check_precision(training: TrainingSpec, cluster: ClusterProfile) -> None:
    """Raise SchemaError unless every device of ``cluster`` computes in the precision ``training``'s
    GEMMs need: an FP8 recipe needs FP8 tensor cores (a device with an fp8 peak: Hopper, Ada,
    Blackwell), MXFP8 block-scaled ones (an mxfp8 peak: Blackwell only)."""
    wanted = training.precision.linear_gemms
    if training.fp8 is None:
        return
    for device in cluster.devices:
        if wanted not in device.peak_flop_per_s:
            cores = "block-scaled (MX) FP8 tensor cores (Blackwell)" if wanted is DType.MXFP8 else "FP8 tensor cores"
            if device.kind is DeviceKind.CUDA and cluster.provenance.kind == "measured":
                fix = (
                    f"if its GPUs have them (Hopper, Blackwell), profile with planner profile --fp8 {training.fp8} "
                    "to time its FP8 GEMMs; else train in bf16 (drop --fp8)"
                )
            elif wanted is DType.MXFP8 and DType.FP8 in device.peak_flop_per_s:  # Hopper, Ada: per-tensor FP8
                fix = (
                    "give a per-tensor recipe instead (tensorwise, or delayed/blockwise on a Transformer Engine stack)"
                )
            else:
                fix = "train in bf16 on it (drop --fp8)"
            raise SchemaError(
                f"fp8 recipe {training.fp8.value!r} needs {cores}, which device {device.name!r} of cluster "
                f"{cluster.name!r} lacks (it has no {wanted} peak); {fix}"
            )


def check_layout(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> None:
    """Raise InfeasibleConfigError if ``layout`` cannot run ``model`` on ``cluster``; SchemaError
    if ``cluster`` cannot compute in ``training``'s precision (``check_precision``)."""
    check_precision(training, cluster)
    if 2 * training.fp8_bf16_layers > model.num_hidden_layers:
        raise SchemaError(
            f"--fp8-bf16-layers {training.fp8_bf16_layers} keeps the first and last {training.fp8_bf16_layers} layers "
            f"in bf16, more than the model's {model.num_hidden_layers}; give at most {model.num_hidden_layers // 2}"
        )
    d, t, p = layout.data_parallel_degree, layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    if model.num_attention_heads % t:
        raise InfeasibleConfigError(
            f"tp={t} does not divide num_attention_heads={model.num_attention_heads}; use a tp that divides it"
        )
    if model.kv_heads % t:
        raise InfeasibleConfigError(
            f"tp={t} does not divide num_key_value_heads={model.kv_heads}; "
            "use a tp that divides it (replicating key/value heads is not modeled)"
        )
    if layout.world_size != cluster.world_size:
        cp = layout.context_parallel_degree
        degrees = f"dp x tp x pp = {d} x {t} x {p}" if cp == 1 else f"dp x cp x tp x pp = {d} x {cp} x {t} x {p}"
        raise InfeasibleConfigError(
            f"{degrees} = {layout.world_size} ranks, but cluster {cluster.name!r} has "
            f"{cluster.world_size} ({cluster.num_nodes} nodes x {cluster.devices_per_node}); "
            "choose degrees whose product is the cluster's size"
        )
    for width in model.mlp_widths:  # dense, routed-expert and shared-expert widths alike
        if width % t:
            key = "intermediate_size" if width == model.ffn_size else "the MoE MLP width (experts or shared experts)"
            raise InfeasibleConfigError(f"tp={t} does not divide {key}={width}")
    check_context_parallel(model, training, layout)
    local = training.seq_len // layout.context_parallel_degree
    if layout.sequence_parallel and local % t:
        share = "seq_len" if layout.context_parallel_degree == 1 else "each context-parallel rank's share, seq_len / cp"
        raise InfeasibleConfigError(f"sequence parallel needs tp={t} to divide {share}={local}")
    replica_batch = d * layout.micro_batch_size
    if training.global_batch_size % replica_batch:
        raise InfeasibleConfigError(
            f"global batch {training.global_batch_size} is not divisible by dp x micro-batch = "
            f"{d} x {layout.micro_batch_size}; pick a micro-batch size or dp that divides it"
        )
    micro_batches = training.global_batch_size // replica_batch
    flushes = pipeline_schedules(layout, training.pipeline_flushes)
    if micro_batches % flushes:
        raise InfeasibleConfigError(
            f"pipeline_flushes={flushes} splits the step's {micro_batches} micro-batches into equal schedules, "
            f"but {flushes} does not divide {micro_batches}; pick a micro-batch size, dp or number of flushes that do"
        )
    if layout.schedule is Schedule.INTERLEAVED and (micro_batches // flushes) % p:
        per = "per step" if flushes == 1 else f"per schedule, {micro_batches} over {flushes} flushes"
        raise InfeasibleConfigError(
            f"the interleaved schedule needs micro-batches {per} ({micro_batches // flushes}) divisible by pp={p}"
        )
    if layout.layer_split is not None and sum(layout.layer_split) != model.num_hidden_layers:
        raise InfeasibleConfigError(
            f"layer_split {list(layout.layer_split)} sums to {sum(layout.layer_split)}, "
            f"but the model has {model.num_hidden_layers} layers"
        )
    if min(chunk_layers(model, layout)) < 1 and layout.layer_split is None:
        raise InfeasibleConfigError(
            f"{model.num_hidden_layers} layers cannot fill pp x v = {layout.num_chunks} model chunks"
        )
    held = stage_layers(model, layout)
    if layout.recompute_layers is not None and any(r > n for r, n in zip(layout.recompute_layers, held, strict=True)):
        raise InfeasibleConfigError(
            f"recompute_layers {list(layout.recompute_layers)} recomputes more layers than a stage holds "
            f"({list(held)}); give each stage at most its own layers"
        )
    if layout.activation_offload_layers >= model.num_hidden_layers:
        raise InfeasibleConfigError(
            f"activation_offload_layers={layout.activation_offload_layers} offloads every layer of the model's "
            f"{model.num_hidden_layers}, but the last layer's backward follows its forward at once; offload at most "
            f"{model.num_hidden_layers - 1}"
        )
    check_experts(model, layout)
    check_offload(cluster, layout)


def check_offload(cluster: ClusterProfile, layout: Layout) -> None:
    """Raise InfeasibleConfigError where ``layout`` offloads but ``cluster`` does not say what its
    hosts hold and how fast its devices copy to them: nothing could price the offload."""
    if layout.optimizer_offload_fraction <= 0 and not layout.activation_offload_layers:
        return
    missing = missing_host_facts(cluster)
    if missing:
        what = (
            f"optimizer_offload_fraction={layout.optimizer_offload_fraction:g}"
            if layout.optimizer_offload_fraction > 0
            else f"activation_offload_layers={layout.activation_offload_layers}"
        )
        raise InfeasibleConfigError(
            f"{what} offloads to the host, but cluster "
            f"{cluster.name!r} does not give {' or '.join(missing)}; plan on a preset that does (dgx-h100, "
            "dgx-a100-80g, ...), add them to the cluster file, or drop the offload"
        )


def missing_host_facts(cluster: ClusterProfile) -> list[str]:
    """What ``cluster`` does not say of its hosts that an offload is priced with: their memory and
    CPU Adam rate, and every device's copy rates to and from them (empty: an offload can be priced)."""
    missing = []
    if cluster.host is None:
        missing.append("its hosts' memory and CPU Adam rate (host)")
    if any(d.host_to_device_bytes_per_s is None or d.device_to_host_bytes_per_s is None for d in cluster.devices):
        missing.append("its devices' host copy rates (host_to_device_bytes_per_s, device_to_host_bytes_per_s)")
    return missing


def check_context_parallel(model: ModelSpec, training: TrainingSpec, layout: Layout) -> None:
    """Raise InfeasibleConfigError unless context parallelism (cp > 1) of ``layout``'s kind can
    split the sequence and run attention: the split's rule (``schemas.context_split``), and for
    the ring the fused attention kernel that ring attention runs block by block."""
    cp = layout.context_parallel_degree
    if cp == 1:
        return
    heads = model.num_attention_heads // layout.tensor_parallel_degree
    check_context_split(layout.context_parallel_kind, cp, training.seq_len, heads)
    if layout.context_parallel_kind is ContextParallelKind.RING and not training.attention_kernel.fused:
        raise InfeasibleConfigError(
            f"context parallelism (cp={cp}) runs ring attention with the fused kernel block by block; "
            "use attention_kernel flash or cudnn, the all-to-all kind (context_parallel_kind 'all-to-all') or cp 1"
        )


def check_stage(layout: Layout, stage: int) -> None:
    """Raise SchemaError if ``stage`` is not a pipeline rank of ``layout``."""
    if not 0 <= stage < layout.pipeline_parallel_degree:
        raise SchemaError(
            f"stage={stage} is not a pipeline rank; it must be in 0..{layout.pipeline_parallel_degree - 1}"
        )
