"""A plan as a torchtitan job config (TOML), for ``torchrun ... -m torchtitan.train --job.config_file``.

Field names are torchtitan v0.2.2's ``torchtitan/config/job_config.py`` (tag v0.2.2, commit
73a0e6979dd10b6b1904098eb3c8f62c18ab87ce; later torchtitan moved to Python configs); its
ConfigManager refuses unknown keys, so a renamed field fails at load, not silently.

How the plan maps:
- Data parallelism: ZeRO 0 is DDP (``data_parallel_replicate_degree`` d), which torchtitan runs
  only as the sole parallelism (beside tp or pp it is refused); ZeRO 2 and 3 are FSDP2
  over the sharding group (``data_parallel_shard_degree`` g, or d) and HSDP replicates across the
  d / g groups (``data_parallel_replicate_degree``); ZeRO 3 reshards the weights after the forward
  (``fsdp_reshard_after_forward = "always"``), ZeRO 2 keeps them gathered for the backward
  ("never", FSDP's ZeRO-2 mode). FSDP2 has no optimizer-only sharding: ZeRO 1 is refused.
- Context parallelism: ``context_parallel_degree`` cp; torchtitan's FSDP shards over its
  dp_shard x cp ranks, as the planner's ZeRO over the d cp data axis (cp fastest in both), so
  ``data_parallel_shard_degree`` is the sharding group over cp, and cp > 1 needs ZeRO 2 or 3 with
  sharding groups of whole context-parallel groups. Its context parallelism is ring attention:
  the all-to-all kind (DeepSpeed-Ulysses) is refused.
- Tensor parallelism: torchtitan's always shards the norms along the sequence (sequence
  parallelism), so a plan with t > 1 without it is refused. Experts: ``expert_parallel_degree``
  and ``expert_tensor_parallel_degree`` (t, or 1 folded), which torchtitan takes from the FSDP
  shard axis (and tp): expert parallelism under ZeRO 0 or 1 is refused.
- Pipeline: the schedule ("GPipe", "1F1B", "Interleaved1F1B"), the micro-batch size, and the
  plan's layer split as ``module_fqns_per_model_part`` (p v parts, part c on rank c % p, the
  embedding with the first and the final norm and output layer with the last), always, because
  torchtitan's own default split weighs the embedding and the output layer as one layer each.
- Batch: ``local_batch_size`` is what one data-parallel rank takes through one pipeline
  schedule (B / (d f), in micro-batches of b, f the plan's ``pipeline_flushes``: torchtitan
  accumulates gradients over the f schedules), or per gradient-accumulation step without a
  pipeline (b, with ``global_batch_size`` B making torchtitan accumulate B / (d b) of them).
- Precision: bf16 and fp32 as ``mixed_precision_param`` with fp32 master weights; torchtitan has
  no fp16 mixed precision, so fp16 is refused. Recompute: ``[activation_checkpoint] mode``;
  selective is torchtitan's per-op policy ("op": keeps the attention's and every other matmul's
  outputs, recomputes the rest), which the plan priced (``SelectiveRecompute.EVERY_OTHER_MATMUL``,
  the torchtitan stack's); a plan that priced Megatron-Core's modules instead is refused.
- MoE: the dispatcher (``expert_parallel_comm_backend`` standard or deepep); torchtitan's MoE
  layers are dropless, so a capacity factor is refused. A plan that priced the tensor-parallel
  collectives overlapped gets torchtitan's async tensor parallelism, with the model compiled,
  which that needs.
- The stack: ``[compile] enable`` where the plan priced fused elementwise kernels (torch.compile
  fuses them; the torchtitan stack's own value) or async tensor parallelism, which needs it, with
  ``components`` 'model', and 'loss' where it priced a fused loss (``LossMethod.FUSED``); a loss
  left out of them runs eager (fp32-eager). Any other loss is refused.
  Gradients summed in bf16 are refused: 0.2.2's ``mixed_precision_reduce`` is float32 only.
- FP8 (torchao): ``[model] converters`` with ``quantize.linear.float8`` (tensorwise, torchao's
  default recipe, with ``enable_fsdp_float8_all_gather`` and
  ``precompute_float8_dynamic_scale_for_fsdp`` where the plan gathers FP8 weights, which needs
  FSDP; rowwise and rowwise_with_gw_hp by ``recipe_name``, which 0.2.2 asserts cannot gather in
  FP8) or ``quantize.linear.mx`` (mxfp8_cublas). ``filter_fqns`` keeps the output layer and an MoE
  router's gate in bf16, and names ``auto_filter_small_kn``, torchao's small-shape filter, which
  the planner priced (``fp8.converts``; the MX converter has none), and the first and last layers
  a plan keeps in bf16 (``layers.<i>.``, matched as a part of each module's name). Routed experts stay bf16
  unless the plan priced them in FP8 (``TrainingSpec.fp8_experts``): then 0.2.2's grouped-GEMM
  converter of the same kind (``quantize.grouped_mm.float8``: rowwise, which it asserts runs without
  pipeline and context parallelism; ``quantize.grouped_mm.mx``: mxfp8) with ``fqns`` 'experts'.
- Left to the user: the model (named for the Llama 3 presets), dataset, optimizer and steps.
"""

from planner.export.common import check_common, layers_per_chunk, micro_batches, refuse
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    ContextParallelKind,
    DType,
    Kernels,
    LossMethod,
    MoeDispatcher,
    Plan,
    Recompute,
    Schedule,
    SelectiveRecompute,
    ZeroStage,
)
from planner.schemas.fp8 import RECIPE_RUNS, Fp8Library, Fp8Recipe
from planner.schemas.geometry import pipeline_schedules
from planner.schemas.plan import PlanShape

TARGET = "torchtitan"
VERSION = "v0.2.2"
COMMIT = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"

_SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B"}
_MODELS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B")}
"""Presets with a torchtitan model of the same architecture: (model.name, model.flavor)."""

TomlValue = int | str | bool | list[str] | list[list[str]]


def torchtitan_config(plan: Plan) -> dict[str, dict[str, TomlValue]]:
    """The job config's sections and keys that carry the plan.

    Raises:
        InfeasibleConfigError: the plan uses a feature torchtitan cannot express (the message says which).
    """
    check(plan)
    layout, training = plan.layout, plan.training
    d, t, p = layout.data_parallel_degree, layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    cp = layout.context_parallel_degree
    shard = layout.shard_degree if layout.zero_stage.shards_gradients else 1
    parallelism: dict[str, TomlValue] = {
        "data_parallel_replicate_degree": d * cp // shard,
        "data_parallel_shard_degree": shard // cp if cp > 1 else shard,
        "tensor_parallel_degree": t,
        "pipeline_parallel_degree": p,
        "context_parallel_degree": cp,
    }
    if shard > 1:
        reshard = "always" if layout.zero_stage is ZeroStage.PARAMETERS else "never"
        parallelism["fsdp_reshard_after_forward"] = reshard
    if p > 1:
        parallelism["pipeline_parallel_schedule"] = _SCHEDULES[layout.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch_size
        parallelism["module_fqns_per_model_part"] = _model_parts(layers_per_chunk(plan))
    if plan.model.is_moe:
        parallelism["expert_parallel_degree"] = layout.expert_parallel_degree
        parallelism["expert_tensor_parallel_degree"] = layout.expert_tensor_degree
        deepep = training.moe_dispatcher is MoeDispatcher.DEEPEP
        parallelism["expert_parallel_comm_backend"] = "deepep" if deepep else "standard"
    async_tp = training.tp_comm_overlap and t > 1
    if async_tp:
        parallelism["enable_async_tensor_parallel"] = True
    # one pipeline schedule's batch: torchtitan accumulates the step's pipeline_flushes of them
    local_batch = layout.micro_batch_size * (
        micro_batches(plan) // pipeline_schedules(layout, training.pipeline_flushes) if p > 1 else 1
    )
    config: dict[str, dict[str, TomlValue]] = {
        "job": {"description": f"{plan.model.name} on {plan.cluster.spec}: {layout.describe()} (planner)"},
    }
    if plan.model.name in _MODELS:
        name, flavor = _MODELS[plan.model.name]
        config["model"] = {"name": name, "flavor": flavor}
    config["training"] = {
        "local_batch_size": local_batch,
        "global_batch_size": training.global_batch_size,
        "seq_len": training.seq_len,
        "dtype": "float32",
        "mixed_precision_param": "bfloat16" if training.dtype is DType.BF16 else "float32",
    }
    if layout.parameter_offload:  # FSDP2's CPUOffloadPolicy: weights, gradients and optimizer on the host
        config["training"]["enable_cpu_offload"] = True
    config["parallelism"] = parallelism
    config["activation_checkpoint"] = {"mode": str(layout.recompute)}
    if layout.recompute is Recompute.SELECTIVE:
        config["activation_checkpoint"]["selective_ac_option"] = "op"
    # fused kernels are torch.compile's; async tensor parallelism is an inductor pass that needs it too
    compiled = ["model"] if async_tp or training.kernels is Kernels.FUSED else []
    if training.loss_method is LossMethod.FUSED:
        compiled.append("loss")
    if compiled:
        config["compile"] = {"enable": True, "components": compiled}
    config |= _float8(plan)
    if training.fp8 is not None:
        kind = _kind(training.fp8)
        converters = [f"quantize.linear.{kind}"] + ([f"quantize.grouped_mm.{kind}"] if _fp8_experts(plan) else [])
        config.setdefault("model", {})["converters"] = converters
    return config


def _kind(recipe: Fp8Recipe) -> str:
    """torchao's quantization a recipe runs under, as torchtitan names its converters and sections."""
    return "mx" if recipe is Fp8Recipe.MXFP8 else "float8"


def _fp8_experts(plan: PlanShape) -> bool:
    """Whether the plan runs an MoE model's routed experts in FP8 (``Precision.fp8_experts``)."""
    return plan.model.is_moe and plan.training.fp8 is not None and plan.training.precision.fp8_experts


def _float8(plan: Plan) -> dict[str, dict[str, TomlValue]]:
    """The quantization section of a plan trained under an FP8 recipe (module docstring)."""
    training = plan.training
    if training.fp8 is None:
        return {}
    kept = ["output", "router.gate"] if plan.model.is_moe else ["output"]
    total, edge = plan.model.num_hidden_layers, training.fp8_bf16_layers  # whole layers kept in bf16
    kept += [f"layers.{i}." for i in (*range(edge), *range(total - edge, total))]
    if training.fp8 is Fp8Recipe.MXFP8:
        sections: dict[str, dict[str, TomlValue]] = {
            "quantize.linear.mx": {"recipe_name": "mxfp8_cublas", "filter_fqns": kept}
        }
        grouped: dict[str, TomlValue] = {"recipe_name": "mxfp8", "fqns": ["experts"]}
    else:
        section: dict[str, TomlValue] = {"filter_fqns": [*kept, "auto_filter_small_kn"]}
        if training.fp8 is not Fp8Recipe.TENSORWISE:
            section["recipe_name"] = RECIPE_RUNS[Fp8Library.TORCHAO, training.fp8].library_name
        elif training.fp8_param_gather:
            section |= {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
        sections, grouped = {"quantize.linear.float8": section}, {"fqns": ["experts"]}
    if _fp8_experts(plan):  # the grouped-GEMM converter of the same kind (module docstring)
        sections[f"quantize.grouped_mm.{_kind(training.fp8)}"] = grouped
    return sections


def check(plan: PlanShape) -> None:
    """Refuse what a torchtitan job config cannot express (``planner search --stack torchtitan``
    leaves such layouts out).

    Raises:
        InfeasibleConfigError: one line naming the feature, why, and what to plan instead.
    """
    check_common(plan, TARGET)
    layout = plan.layout
    float8_experts = _fp8_experts(plan) and plan.training.fp8 is not Fp8Recipe.MXFP8
    if float8_experts and (layout.pipeline_parallel_degree > 1 or layout.context_parallel_degree > 1):
        refuse(
            TARGET,
            f"routed experts in FP8 (quantize.grouped_mm.float8) with pp={layout.pipeline_parallel_degree}, "
            f"cp={layout.context_parallel_degree}",
            "0.2.2's float8 grouped-GEMM converter asserts it runs without pipeline and context parallelism",
            "plan with --no-fp8-experts, or with --pp 1 --cp 1",
        )
    if layout.activation_offload_layers:
        refuse(
            TARGET,
            f"activations offloaded from {layout.activation_offload_layers} layers",
            "its trainer offloads no activations (its activation checkpointing recomputes them)",
            "estimate without --activation-offload, or export to megatron",
        )
    if layout.optimizer_offload_fraction > 0 and not layout.parameter_offload:
        refuse(
            TARGET,
            f"{layout.optimizer_offload_fraction:g} of the optimizer states offloaded",
            "its enable_cpu_offload moves the parameters and gradients to the host too (FSDP2's CPUOffloadPolicy), "
            "which the plan does not price",
            "export to megatron (ZeRO-1) or deepspeed, estimate with --parameter-offload (ZeRO-3), or search with "
            "--no-optimizer-offload",
        )
    if layout.recompute_layers is not None:
        refuse(
            TARGET,
            f"full recompute of {list(layout.recompute_layers)} layers on the pipeline stages",
            "its activation checkpointing applies one policy to every layer of every stage",
            "plan with full recompute of every layer, or export to megatron (the same count on every stage)",
        )
    if layout.recompute is Recompute.SELECTIVE and plan.training.selective_recompute is SelectiveRecompute.MODULES:
        refuse(
            TARGET,
            "selective recompute of the layout's modules",
            "its selective checkpointing is the per-op policy it exports ('op') or a per-layer one",
            "plan with --selective-recompute every-other-matmul, or export to megatron",
        )
    if layout.recompute is Recompute.SELECTIVE and layout.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        refuse(
            TARGET,
            f"selective recompute of {'+'.join(layout.recompute_modules)}",
            "its selective checkpointing is a per-op or per-layer policy, not Megatron-Core's modules",
            "plan with --recompute-modules core_attn, or export to megatron",
        )
    if plan.training.dtype is DType.FP16:
        refuse(TARGET, "dtype=fp16", "its mixed precision is bfloat16 or float32", "plan with --dtype bf16")
    if plan.training.loss_method not in (LossMethod.FUSED, LossMethod.FP32_EAGER):
        refuse(
            TARGET,
            f"a {plan.training.loss_method} loss",
            "its loss is torch's cross_entropy over fp32 logits, compiled or eager",
            "plan with --loss-method fused (or fp32-eager)",
        )
    if plan.training.reduce_dtype is not DType.FP32:
        refuse(
            TARGET,
            f"gradients summed in {plan.training.reduce_dtype}",
            "its mixed_precision_reduce is float32 only",
            "plan with --grad-reduce-dtype fp32",
        )
    cp = layout.context_parallel_degree
    if cp > 1 and layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL:
        refuse(
            TARGET,
            f"all-to-all context parallelism (cp={cp}, DeepSpeed-Ulysses)",
            "its context parallelism is torch's ring attention, whose context_parallel_rotate_method (allgather, "
            "alltoall) only chooses how key/value shards move: attention is never split by heads",
            "plan with --cp-kind ring, or export to megatron",
        )
    if cp > 1 and not (layout.zero_stage.shards_gradients and layout.shard_degree % cp == 0):
        refuse(
            TARGET,
            f"context parallelism (cp={cp}) under ZeRO-{int(layout.zero_stage)}"
            + (f" in sharding groups of {layout.shard_degree}" if layout.zero_stage.shards_gradients else ""),
            "its FSDP shards the weights over the context-parallel ranks with the data-parallel ones",
            "plan with --zero-stage 2 or 3 (sharding groups a multiple of cp), or export to megatron",
        )
    model_parallel = layout.tensor_parallel_degree * layout.pipeline_parallel_degree
    if layout.zero_stage is ZeroStage.NONE and layout.data_parallel_degree > 1 and model_parallel > 1:
        refuse(
            TARGET,
            "ZeRO-0 data parallelism beside tensor or pipeline parallelism",
            "its DDP runs only where data parallelism is the only parallelism",
            "plan with --zero-stage 2 or 3",
        )
    if layout.zero_stage is ZeroStage.OPTIMIZER and layout.shard_degree > 1:
        refuse(
            TARGET,
            "ZeRO-1",
            "FSDP2 shards the weights and gradients with the optimizer states, never the states alone",
            "plan with --zero-stage 2 or 3, or export to megatron or deepspeed",
        )
    if layout.secondary_partition_size is not None:
        refuse(
            TARGET,
            f"secondary_partition_size={layout.secondary_partition_size} (hpZ)",
            "fsdp_reshard_after_forward reshards over the whole shard group or not at all",
            "search with --no-hierarchical-sharding, or estimate without --secondary-partition-size",
        )
    if layout.tensor_parallel_degree > 1 and not layout.sequence_parallel:
        refuse(
            TARGET,
            "tensor parallelism without sequence parallelism",
            "its tensor-parallel plan always shards the norms along the sequence",
            "estimate with --sequence-parallel, or search with --stack torchtitan",
        )
    if plan.training.fp8_param_gather and not layout.zero_stage.shards_gradients:
        refuse(
            TARGET,
            f"FP8 parameter all-gather under ZeRO-{int(layout.zero_stage)}",
            "enable_fsdp_float8_all_gather gathers FSDP's sharded weights in FP8, and no FSDP runs",
            "plan with --zero-stage 2 or 3, or without --fp8-param-gather",
        )
    if plan.training.moe_capacity_factor is not None:
        refuse(
            TARGET,
            f"moe_capacity_factor={plan.training.moe_capacity_factor:g}",
            "its MoE layers compute every routed token (dropless)",
            "plan without --capacity-factor",
        )
    if layout.expert_parallel_degree > 1 and not layout.zero_stage.shards_gradients:
        refuse(
            TARGET,
            f"expert parallelism under ZeRO-{int(layout.zero_stage)}",
            "it takes the expert-parallel ranks from the FSDP shard axis and shards the experts over the rest",
            "plan with --zero-stage 2 or 3",
        )


def _model_parts(per_chunk: tuple[int, ...]) -> list[list[str]]:
    """The module names of each model chunk: torchtitan's decoder names its modules
    tok_embeddings, layers.<i>, norm and output."""
    parts: list[list[str]] = []
    first = 0
    for chunk, layers in enumerate(per_chunk):
        part = [f"layers.{i}" for i in range(first, first + layers)]
        if chunk == 0:
            part.insert(0, "tok_embeddings")
        if chunk == len(per_chunk) - 1:
            part += ["norm", "output"]
        parts.append(part)
        first += layers
    return parts


def torchtitan_toml(plan: Plan) -> str:
    """The job config as TOML text, with a header naming the plan and the torchtitan version.

    Raises:
        InfeasibleConfigError: as :func:`torchtitan_config`.
    """
    config = torchtitan_config(plan)
    lines = [
        f"# torchtitan {VERSION} job config from a planner plan: {plan.model.name} on {plan.cluster.spec}",
        f"# predicted step time {plan.estimate.step_time_s:.3f} s; dataset, optimizer, steps and compile "
        "are yours to set",
    ]
    if "name" not in config.get("model", {}):
        lines.append(f"# [model] name and flavor: torchtitan's model of {plan.model.name!r}'s architecture")
    for section, keys in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def _toml(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if all(isinstance(item, str) for item in value):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return "[\n" + "".join(f"    {_toml(part)},\n" for part in value) + "]"
