"""A plan as Megatron-LM command-line arguments, for ``torchrun ... pretrain_gpt.py <these> <yours>``.

Argument names are Megatron-LM core_v0.15.0's ``megatron/training/arguments.py`` (commit
0d7e02bd26d3eb347ad8d1bef625002babfa6df7, the last release whose arguments are spelled out
there; later ones generate them from config dataclasses under the same names).

How the plan maps:
- Degrees: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --context-parallel-size with --cp-comm-type p2p (ring attention) or a2a (the all-to-all kind,
  DeepSpeed-Ulysses; refused where cp does not divide a tp rank's kv heads, which Transformer
  Engine's a2a needs), the kind the plan priced,
  --expert-model-parallel-size and --expert-tensor-parallel-size (t, or 1 for MoE parallel
  folding); Megatron's default rank order (tp fastest, then cp, then dp, then pp) is the
  planner's. Its distributed optimizer and Megatron-FSDP shard over the data-and-context group,
  the d cp ranks over which the planner's ZeRO shards.
- Data parallelism: ZeRO 1 is the distributed optimizer (--use-distributed-optimizer), and its
  HSDP the partial distributed optimizer (--num-distributed-optimizer-instances d / g). ZeRO 2
  and 3 are Megatron-FSDP (--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads /
  optim_grads_params, with the flags it requires), which supports tensor, expert and context
  parallelism but not pipelines: ZeRO 2/3 with a pipeline, HSDP under them, and ZeRO-3's hpZ are
  refused.
- Pipeline: 1F1B, interleaved with v virtual stages; GPipe is not one of Megatron's schedules and
  is refused. The plan's layer split: even needs nothing (or
  --num-layers-per-virtual-pipeline-stage); uneven only in the first and last stage is
  --decoder-first/last-pipeline-num-layers; any other split is --pipeline-model-parallel-layout
  (E embedding, t layer, L loss, stages by "|" in chunk order, chunk c on rank c % p).
  --no-overlap-p2p-communication where the plan priced interleaved transfers as exposed.
- Optimizer offload: --optimizer-cpu-offload --optimizer-offload-fraction f with the
  --use-precision-aware-optimizer it requires, on the distributed optimizer (ZeRO-1, or one
  data-parallel rank, whose states it holds whole); Megatron-FSDP's optimizer does not offload, so
  ZeRO 2-3 (and ZeRO-0 over several replicas) with an offload are refused. Its hybrid optimizer
  moves whole parameter tensors of the shard to the host until the fraction is reached.
- Activation offload: --cpu-offloading-num-layers N (Transformer Engine's CPU offload of the
  first N layers' activations; the flag of releases after core_v0.15.0, generated from
  TransformerConfig's cpu_offloading_num_layers, which turns cpu_offloading on; core_v0.15.0
  itself sets both from Python only). Megatron-Core offloads without a pipeline and without
  recompute, as ``Layout.activation_offload_layers`` requires.
- Recompute: full is --recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1 (every layer's input kept, the layer recomputed), and the first N
  layers of every stage (``Layout.recompute_layers``, equal on every stage; unequal counts are
  refused) --recompute-method block --recompute-num-layers N; selective is
  --recompute-granularity selective (core attention, Korthikanti et al.'s), with
  --recompute-modules where the plan names other modules (``Layout.recompute_modules``).
- Batch and precision: --micro-batch-size b, --global-batch-size B (Megatron accumulates
  B / (d b) micro-batches), --seq-length, --bf16 / --fp16 (fp32 is the default).
- FP8 (Transformer Engine, Megatron's default --transformer-impl): --fp8-format and --fp8-recipe
  (``FP8_FORMATS``: hybrid, E4M3 forward and E5M2 gradients, for the per-tensor recipes as
  Megatron's Llama 3 FP8 example and Megatron Bridge's recipes run them; E4M3 throughout for
  blockwise and MXFP8, as Megatron's MoE README configures them), --fp8-param-gather (which
  needs the distributed optimizer or Megatron-FSDP), and --moe-router-padding-for-fp8 for an MoE
  model (Transformer Engine's FP8 grouped GEMMs need each expert's tokens aligned). Delayed
  scaling with selective recompute of moe_act or layernorm is refused, as Megatron refuses it.
  The first and last layers kept in bf16: --first-last-layers-bf16 with
  --num-layers-at-start/end-in-bf16 (refused under delayed scaling, and beyond a stage's layers,
  as Megatron refuses them).
- MoE: --num-experts, --moe-router-topk, the dispatcher (alltoall; DeepEP as flex +
  --moe-enable-deepep), capacity factor and padding (refused with DeepEP: the flex dispatcher
  does not pad); --tp-comm-overlap where the plan priced it.
- The stack's behaviours that Megatron-LM runs otherwise by default (the plan re-priced as
  megatron-lm runs it keeps the ones it was told: ``TrainingSpec.under``):
  --cross-entropy-loss-fusion where the loss runs fused, --attention-backend flash or unfused
  where the plan priced FlashAttention-2 or eager attention (auto, the default, lets Transformer
  Engine pick cuDNN's fused attention on Hopper), --grad-reduce-in-bf16 where gradients are
  summed in bf16. Eager elementwise kernels have no switch: Megatron-Core fuses them. A loss
  other than fp32 in place (``LossMethod``) is refused: both of its cross-entropies are; so is a
  selective recompute other than of modules (``SelectiveRecompute``).
- Left to the user: the rest of the model's shape, tokenizer, data, optimizer and schedule.
"""

import shlex

from planner.export.common import check_common, layers_per_chunk, refuse
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    AttentionKernel,
    ContextParallelKind,
    DType,
    Kernels,
    Layout,
    LossMethod,
    MoeDispatcher,
    Plan,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    ZeroStage,
)
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.geometry import pipeline_schedules, stage_layers
from planner.schemas.plan import PlanShape

TARGET = "megatron"
VERSION = "core_v0.15.0"
COMMIT = "0d7e02bd26d3eb347ad8d1bef625002babfa6df7"


def megatron_args(plan: Plan) -> tuple[str, ...]:
    """Megatron-LM's arguments for the plan, flag and value as separate words.

    Raises:
        InfeasibleConfigError: the plan uses a feature Megatron-LM cannot express (the message says which).
    """
    check(plan)
    layout, training, model = plan.layout, plan.training, plan.model
    args = [
        "--tensor-model-parallel-size",
        str(layout.tensor_parallel_degree),
        "--pipeline-model-parallel-size",
        str(layout.pipeline_parallel_degree),
    ]
    if layout.context_parallel_degree > 1:
        comm = "a2a" if layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL else "p2p"
        args += ["--context-parallel-size", str(layout.context_parallel_degree), "--cp-comm-type", comm]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if training.tp_comm_overlap and layout.sequence_parallel:
        args.append("--tp-comm-overlap")
    args += ["--num-layers", str(model.num_hidden_layers), *_pipeline_split(plan)]
    if layout.virtual_stages > 1 and not training.pp_comm_overlap:
        args.append("--no-overlap-p2p-communication")
    args += _data_parallel(plan)
    args += _recompute(layout)
    if layout.activation_offload_layers:  # one stage, no recompute (the layout's rule is Megatron-Core's)
        args += ["--cpu-offloading-num-layers", str(layout.activation_offload_layers)]
    if layout.recompute is Recompute.SELECTIVE and layout.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        args += ["--recompute-modules", *layout.recompute_modules]
    args += ["--micro-batch-size", str(layout.micro_batch_size)]
    args += ["--global-batch-size", str(training.global_batch_size), "--seq-length", str(training.seq_len)]
    args += {DType.BF16: ["--bf16"], DType.FP16: ["--fp16"], DType.FP32: []}[training.dtype]
    args += _fp8(plan)
    args += _stack_flags(plan)
    if model.is_moe:
        args += _experts(plan)
    return tuple(args)


FP8_FORMATS = {
    Fp8Recipe.DELAYED: "hybrid",
    Fp8Recipe.TENSORWISE: "hybrid",
    Fp8Recipe.BLOCKWISE: "e4m3",
    Fp8Recipe.MXFP8: "e4m3",
}
"""--fp8-format for each Transformer Engine recipe (module docstring)."""


def _fp8(plan: Plan) -> list[str]:
    """The FP8 arguments of a plan trained under an FP8 recipe (module docstring); none without."""
    training = plan.training
    if training.fp8 is None:
        return []
    args = ["--fp8-format", FP8_FORMATS[training.fp8], "--fp8-recipe", str(training.fp8)]
    if training.fp8_param_gather:
        args.append("--fp8-param-gather")
    if edge := training.fp8_bf16_layers:
        args += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(edge)]
        args += ["--num-layers-at-end-in-bf16", str(edge)]
    if plan.model.is_moe:
        args.append("--moe-router-padding-for-fp8")
    return args


ATTENTION_BACKENDS = {AttentionKernel.FLASH: "flash", AttentionKernel.EAGER: "unfused"}
"""--attention-backend for the attention kernels auto would not pick (``AttnBackend``'s names)."""


def _stack_flags(plan: Plan) -> list[str]:
    """The arguments that make Megatron-LM run the plan's loss, attention and gradient reduction as
    it was priced, where that is not Megatron-LM's default."""
    training = plan.training
    flags = []
    if (training.loss_kernels or training.kernels) is Kernels.FUSED:
        flags.append("--cross-entropy-loss-fusion")
    if training.attention_kernel in ATTENTION_BACKENDS:
        flags += ["--attention-backend", ATTENTION_BACKENDS[training.attention_kernel]]
    if training.dtype is DType.BF16 and training.reduce_dtype is DType.BF16:
        flags.append("--grad-reduce-in-bf16")
    return flags


def check(plan: PlanShape) -> None:
    """Refuse what Megatron-LM's arguments cannot express (``planner search --stack megatron-lm``
    leaves such layouts out).

    Raises:
        InfeasibleConfigError: one line naming the feature, why, and what to plan instead.
    """
    check_common(plan, TARGET)
    if (
        plan.layout.recompute is Recompute.SELECTIVE
        and plan.training.selective_recompute is not SelectiveRecompute.MODULES
    ):
        refuse(
            TARGET,
            f"selective recompute as {plan.training.selective_recompute}",
            "its selective recompute re-runs --recompute-modules",
            "plan with --selective-recompute modules",
        )
    if plan.training.loss_method is not LossMethod.FP32_IN_PLACE:
        refuse(
            TARGET,
            f"a {plan.training.loss_method} loss",
            "its cross-entropy, fused or not, keeps one fp32 softmax and makes it the gradient in place",
            "plan with --loss-method fp32-in-place",
        )
    layout = plan.layout
    if layout.pipeline_parallel_degree > 1 and layout.schedule is Schedule.GPIPE:
        refuse(TARGET, "the GPipe schedule", "its pipelines run 1F1B or interleaved", "plan with --schedule 1f1b")
    if pipeline_schedules(layout, plan.training.pipeline_flushes) > 1:
        refuse(
            TARGET,
            f"pipeline_flushes={plan.training.pipeline_flushes}",
            "it runs all of a step's micro-batches in one pipeline schedule",
            "plan with --pipeline-flushes 1",
        )
    cp, kv = layout.context_parallel_degree, plan.model.kv_heads // layout.tensor_parallel_degree
    if cp > 1 and layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL and kv % cp:
        refuse(
            TARGET,
            f"all-to-all context parallelism over cp={cp} ranks with {kv} key/value heads a tensor-parallel rank",
            "Transformer Engine's a2a needs cp to divide them (the plan repeats them, it does not)",
            "plan with --cp-kind ring, or a cp that divides the key/value heads of a tp rank",
        )
    if layout.recompute_layers is not None and len(set(layout.recompute_layers)) > 1:
        refuse(
            TARGET,
            f"full recompute of {list(layout.recompute_layers)} layers on the pipeline stages",
            "--recompute-num-layers recomputes as many layers on every stage",
            "plan with the same count on every stage (--recompute-layers), or full recompute",
        )
    replicated = layout.zero_stage is ZeroStage.NONE and layout.dense_replicas > 1
    if layout.optimizer_offload_fraction > 0 and (layout.shards_over_replicas or replicated):
        refuse(
            TARGET,
            f"optimizer states offloaded under ZeRO-{int(layout.zero_stage)} over {layout.dense_replicas} replicas",
            "its optimizer CPU offload runs on the distributed optimizer (ZeRO-1), not Megatron-FSDP's nor "
            "on replicated states",
            "plan with --zero-stage 1, or export to deepspeed",
        )
    _check_fp8(plan)
    if plan.training.moe_pad_to_capacity and plan.training.moe_dispatcher is MoeDispatcher.DEEPEP:
        refuse(
            TARGET,
            "expert inputs padded to capacity with the DeepEP dispatcher",
            "Megatron-Core's flex dispatcher, which runs DeepEP, does not pad them",
            "plan with --moe-dispatcher alltoall or --no-pad-to-capacity",
        )
    if layout.secondary_partition_size is not None:
        refuse(
            TARGET,
            f"secondary_partition_size={layout.secondary_partition_size} (hpZ)",
            "Megatron-FSDP gathers ZeRO-3's weights over the whole shard group",
            "search with --no-hierarchical-sharding, or estimate without --secondary-partition-size",
        )
    fsdp = layout.shards_over_replicas
    if fsdp and layout.pipeline_parallel_degree > 1:
        refuse(
            TARGET,
            f"ZeRO-{int(layout.zero_stage)} with a pipeline",
            "Megatron-FSDP supports tensor, expert and context parallelism, not pipelines",
            "plan with --zero-stage 0,1, or export to torchtitan",
        )
    if fsdp and layout.sharding_group_size is not None:
        refuse(
            TARGET,
            f"HSDP (sharding_group_size={layout.sharding_group_size}) under ZeRO-{int(layout.zero_stage)}",
            "its replicated instances are the distributed optimizer's (ZeRO-1)",
            "plan with --zero-stage 1, search with --no-hierarchical-sharding, estimate without "
            "--sharding-group-size, or export to torchtitan",
        )


def _check_fp8(plan: PlanShape) -> None:
    """Refuse the FP8 combinations Megatron-LM refuses (its arguments.py and TransformerConfig)."""
    training, layout = plan.training, plan.layout
    if training.fp8_param_gather and layout.zero_stage is ZeroStage.NONE:
        refuse(
            TARGET,
            "--fp8-param-gather without a sharded optimizer",
            "it gathers FP8 weights only from the distributed optimizer or Megatron-FSDP",
            "plan with --zero-stage 1, or without --fp8-param-gather",
        )
    edge, per_stage = training.fp8_bf16_layers, min(stage_layers(plan.model, layout))
    if edge and training.fp8 is Fp8Recipe.DELAYED:
        refuse(
            TARGET,
            f"the first and last {edge} layers in bf16 under fp8 recipe 'delayed'",
            "Transformer Engine's delayed scaling keeps every layer in FP8",
            "plan with another --fp8 recipe (tensorwise), or without --fp8-bf16-layers",
        )
    if edge > per_stage:
        refuse(
            TARGET,
            f"the first and last {edge} layers in bf16 with {per_stage} layers on a pipeline stage",
            "it keeps at most a stage's layers in bf16 at either end",
            f"plan with --fp8-bf16-layers {per_stage} or fewer",
        )
    delayed_modules = {RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM} & set(layout.recompute_modules)
    if training.fp8 is Fp8Recipe.DELAYED and layout.recompute is Recompute.SELECTIVE and delayed_modules:
        refuse(
            TARGET,
            f"selective recompute of {', '.join(sorted(delayed_modules))} under fp8 recipe 'delayed'",
            "Transformer Engine's delayed scaling cannot recompute them",
            "plan with another --fp8 recipe (tensorwise) or other --recompute-modules",
        )


def _pipeline_split(plan: Plan) -> list[str]:
    layout = plan.layout
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    per_chunk = layers_per_chunk(plan)
    if p == 1:
        return []
    if len(set(per_chunk)) == 1:
        return ["--num-layers-per-virtual-pipeline-stage", str(per_chunk[0])] if v > 1 else []
    first, *middle, last = per_chunk
    if v == 1 and len(set(middle)) <= 1 and first > 0 and last > 0:
        return [
            "--decoder-first-pipeline-num-layers",
            str(first),
            "--decoder-last-pipeline-num-layers",
            str(last),
        ]
    return ["--pipeline-model-parallel-layout", _layout_string(per_chunk)]


def _layout_string(per_chunk: tuple[int, ...]) -> str:
    """Megatron's pipeline layout: each chunk's layers as t (t*n for n > 1), the embedding E
    before the first, the loss L after the last, chunks separated by "|"."""
    stages = []
    for chunk, layers in enumerate(per_chunk):
        body = "t" if layers == 1 else f"t*{layers}" if layers else ""
        stages.append(("E" if chunk == 0 else "") + body + ("L" if chunk == len(per_chunk) - 1 else ""))
    return "|".join(stages)


def _data_parallel(plan: Plan) -> list[str]:
    layout = plan.layout
    d, zero = layout.dense_replicas, layout.zero_stage  # the data-and-context group: d cp ranks
    fraction = layout.optimizer_offload_fraction
    if fraction == 0 and (d == 1 or zero is ZeroStage.NONE):
        return []
    if zero is ZeroStage.OPTIMIZER or fraction > 0:  # an offload: ZeRO-1, or one rank (``check``)
        instances = d // layout.shard_degree
        distributed = ["--use-distributed-optimizer"] + (
            ["--num-distributed-optimizer-instances", str(instances)] if instances > 1 else []
        )
        if fraction == 0:
            return distributed
        offload = ["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction"]
        return [*distributed, *offload, f"{fraction:g}"]
    strategy = "optim_grads_params" if zero is ZeroStage.PARAMETERS else "optim_grads"
    return [
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        strategy,
        "--use-distributed-optimizer",
        "--no-gradient-accumulation-fusion",
        "--ckpt-format",
        "fsdp_dtensor",
    ]


def _recompute(layout: Layout) -> list[str]:
    recompute = layout.recompute
    if layout.recompute_layers is not None:  # equal on every stage (``check``): the first N of each
        count = layout.recompute_layers[0]
        return (
            ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(count)]
            if count
            else []
        )
    if recompute is Recompute.FULL:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if recompute is Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]
    return []


def _experts(plan: Plan) -> list[str]:
    layout, training, model = plan.layout, plan.training, plan.model
    args = [
        "--num-experts",
        str(model.num_local_experts),
        "--moe-router-topk",
        str(model.num_experts_per_tok),
        "--expert-model-parallel-size",
        str(layout.expert_parallel_degree),
        "--expert-tensor-parallel-size",
        str(layout.expert_tensor_degree),
    ]
    if training.moe_dispatcher is MoeDispatcher.DEEPEP:
        args += ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"]
    else:
        args += ["--moe-token-dispatcher-type", "alltoall"]
    if training.moe_capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", f"{training.moe_capacity_factor:g}"]
        if training.moe_pad_to_capacity:
            args.append("--moe-pad-expert-input-to-capacity")
    return args


def megatron_text(plan: Plan) -> str:
    """The arguments as shell text on one line, and nothing else: pasted after ``pretrain_gpt.py``
    or read with ``$(cat megatron.args)``, a comment or a continuation backslash would reach
    Megatron-LM's parser as a word (``$(cat ...)`` does not strip them), so what the arguments
    come from is :func:`megatron_note`. A value with shell characters (the ``|`` of a layout
    string) is quoted, for a paste or ``eval``.

    Raises:
        InfeasibleConfigError: as :func:`megatron_args`.
    """
    return shlex.join(megatron_args(plan)) + "\n"


def megatron_note(plan: Plan) -> str:
    """What :func:`megatron_text`'s arguments come from and what they leave to the user, as a
    note printed beside them (never inside: they must stay pasteable)."""
    return (
        f"Megatron-LM {VERSION} arguments from a planner plan: {plan.model.name} on {plan.cluster.spec}; "
        f"{plan.layout.describe()}; predicted step time {plan.estimate.step_time_s:.3f} s. Add the model's "
        "shape, tokenizer, data and optimizer."
    )
