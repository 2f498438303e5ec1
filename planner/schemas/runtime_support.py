"""What this planner's runtime runs: the plans `planner run` refuses before any work, stated once
so that `planner launch` refuses the same plans without importing torch (the runtime calls
``check_runnable`` from ``runtime.run.check_world``; the launch export before printing a command
that could only fail on every node). ``check_buildable`` refuses the models whose layers the
runtime's decoder does not build as the cost model prices them, for every command that would
run one (`planner run`, its dry run, `planner launch`, `planner tune`); `planner search` still
plans them."""

from collections.abc import Mapping
from types import MappingProxyType

from planner.schemas.context_split import check_context_split
from planner.schemas.enums import (
    DType,
    MoeDispatcher,
    PositionEmbedding,
    Recompute,
    RecomputeModule,
)
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.fp8 import Fp8Devices, Fp8Recipe
from planner.schemas.geometry import num_micro_batches, pipeline_schedules
from planner.schemas.layout import Layout
from planner.schemas.model import ModelSpec
from planner.schemas.plan import PlanShape

OUTPUT_DISCARDING = (RecomputeModule.LAYERNORM, RecomputeModule.MOE_ACT)
"""Recompute modules that free a module's output once its consumer ran and rebuild it in the
backward (Megatron-Core's ``CheckpointWithoutOutput``): torch's ``checkpoint`` keeps a region's
output for its consumer, so the runtime does not run them (it checkpoints core_attn, mlp, moe)."""


def check_recompute_modules(layout: Layout) -> None:
    """Refuse selective recomputation of modules the runtime does not checkpoint
    (``OUTPUT_DISCARDING``). The dry run refuses them too: it would trace them kept.

    Raises:
        InfeasibleConfigError: naming the modules and the ones the runtime runs.
    """
    discarding = [m for m in layout.recompute_modules if m in OUTPUT_DISCARDING]
    if layout.recompute is Recompute.SELECTIVE and discarding:
        raise InfeasibleConfigError(
            f"the plan recomputes {', '.join(discarding)} (output-discarding checkpoints, as Megatron-Core runs "
            "them), which this runtime does not build; plan with --recompute-modules from core_attn, mlp, moe to "
            "run it here"
        )


def check_pipeline_flushes(layout: Layout, flushes: int) -> None:
    """Refuse a step run as several pipeline schedules (``TrainingSpec.pipeline_flushes``) with the
    vocabulary split over the pipeline: the runtime runs the vocabulary passes once a step.

    Raises:
        InfeasibleConfigError: naming the schedules and the layout, and how to plan one that runs.
    """
    schedules = pipeline_schedules(layout, flushes)
    if schedules > 1 and layout.vocabulary_layout.over_pipeline:
        raise InfeasibleConfigError(
            f"the plan runs each step as {schedules} pipeline schedules (pipeline_flushes) with the vocabulary split "
            f"over the pipeline ({layout.vocabulary_layout!s}), but this runtime runs the vocabulary passes once a "
            "step; plan with --vocabulary-layout pinned or --pipeline-flushes 1 to run it here"
        )


def check_runnable(plan: PlanShape, *, cuda: bool) -> None:
    """Refuse a plan the runtime cannot run on a job with (``cuda``) or without CUDA devices,
    whatever the job's size (``runtime.run.check_world`` checks that).

    Raises:
        InfeasibleConfigError: the plan, the reason, and how to plan one that runs.
    """
    layout, training = plan.layout, plan.training
    check_recompute_modules(layout)
    schedules = pipeline_schedules(layout, training.pipeline_flushes)
    micro_batches = num_micro_batches(training.global_batch_size, layout) // schedules
    if 1 < layout.pipeline_parallel_degree > micro_batches:
        a_step = "a step" if schedules == 1 else f"a schedule ({schedules} a step)"
        raise InfeasibleConfigError(
            f"the plan runs {micro_batches} micro-batch(es) {a_step} through {layout.pipeline_parallel_degree} "
            "pipeline stages; torch's pipeline schedules need at least one per stage: lower micro_batch_size, "
            "raise the global batch or lower --pipeline-flushes (planner search never proposes this)"
        )
    check_pipeline_flushes(layout, training.pipeline_flushes)
    if training.tp_comm_overlap and cuda and layout.tensor_parallel_degree > 1:
        raise InfeasibleConfigError(
            "the plan is priced with tensor-parallel collectives behind their GEMMs (tp_comm_overlap), but this "
            "runtime runs them synchronously; plan without --tp-comm-overlap to run it here"
        )
    if training.vocabulary_overlap and layout.vocabulary_layout.over_pipeline:
        raise InfeasibleConfigError(
            f"the plan is priced with the {layout.vocabulary_layout!s} passes behind the layers (vocabulary_overlap), "
            "as Vocabulary Parallelism's own schedule runs them, but this runtime runs each pass synchronously; "
            "plan without --vocabulary-overlap to run it here"
        )
    if training.moe_dispatcher is not MoeDispatcher.ALLTOALL and layout.expert_parallel_degree > 1:
        raise InfeasibleConfigError(
            f"the plan is priced with the {training.moe_dispatcher} token dispatcher, but this runtime sends "
            "every (token, expert) pair with one all-to-all; plan with --moe-dispatcher alltoall to run it"
        )
    secondary = layout.secondary_partition_size
    if secondary is not None and (layout.tensor_parallel_degree > 1 or layout.pipeline_parallel_degree > 1):
        raise InfeasibleConfigError(
            f"the plan keeps ZeRO-3's weights on a secondary partition of {secondary} ranks ({layout.describe()}) "
            "beside tensor or pipeline parallelism, which FSDP2 (torch 2.13) cannot reshard to; plan with "
            "planner search --no-hierarchical-sharding, or without tensor and pipeline parallelism"
        )
    cp = layout.context_parallel_degree
    if cp > 1:
        heads = plan.model.num_attention_heads // layout.tensor_parallel_degree
        check_context_split(layout.context_parallel_kind, cp, training.seq_len, heads)
    if cp > 1 and plan.model.is_mla:
        raise InfeasibleConfigError(
            f"the plan runs {plan.model.name}'s multi-head latent attention under context parallelism (cp={cp}), "
            "which this runtime's ring and all-to-all attention do not run as priced (they would exchange values "
            "zero-padded to the query/key width); plan with --cp 1 to run it here"
        )
    if cp > 1 and layout.vocabulary_layout.over_pipeline:
        raise InfeasibleConfigError(
            f"the plan splits the vocabulary over the pipeline ({layout.vocabulary_layout!s}) beside context "
            "parallelism, which this runtime does not combine yet; plan with vocabulary_layout 'pinned' to run it"
        )
    if plan.model.position_embedding_type is PositionEmbedding.ALIBI:
        raise InfeasibleConfigError(
            f"{plan.model.name} uses ALiBi position biases, which this runtime does not build (it runs rotary or "
            "learned positions); the plan's estimate holds, run it with a trainer that builds ALiBi"
        )
    if training.moe_capacity_factor is not None:
        raise InfeasibleConfigError(
            f"the plan drops tokens over a capacity factor of {training.moe_capacity_factor}, but the runtime "
            "routes every token to its experts (dropless); plan without --capacity-factor to run it"
        )
    if plan.model.is_moe and (layout.expert_parallel_degree > 1 or layout.folds_experts):
        check_sharded_experts(layout, fp32=training.dtype is DType.FP32)
    check_fp8_param_gather(layout, fp8_param_gather=training.fp8_param_gather)
    check_mxfp8_tokens(plan)
    check_offloads(plan, cuda=cuda)


def check_offloads(plan: PlanShape, *, cuda: bool) -> None:
    """Refuse an offload the runtime cannot run: any (``Layout.optimizer_offload_fraction``,
    ``Layout.activation_offload_layers``) on CPU devices, whose host is their memory; an optimizer
    offload under ZeRO-2/3 over several replicas, where FSDP2 would offload the parameters and
    gradients with the states (``CPUOffloadPolicy``), which the plan does not price
    (``Layout.parameter_offload`` prices it); in fp32, which has no master weights to offload
    (``runtime.optim``); the weight shards of an MoE model, whose experts the runtime keeps outside
    FSDP2."""
    layout, dtype = plan.layout, plan.training.dtype
    fraction = layout.optimizer_offload_fraction
    if not cuda and (fraction > 0 or layout.activation_offload_layers):
        what, fix = (
            (f"{fraction:g} of its optimizer states", "plan without --optimizer-offload")
            if fraction > 0
            else (f"{layout.activation_offload_layers} layers' activations", "plan without --activation-offload")
        )
        raise InfeasibleConfigError(
            f"the plan keeps {what} in host memory, but on CPU devices the host is the devices' own memory: "
            f"nothing would move; {fix} for a CPU cluster"
        )
    if fraction <= 0:
        return
    if layout.shards_over_replicas and not layout.parameter_offload:
        raise InfeasibleConfigError(
            f"the plan offloads optimizer states under ZeRO-{int(layout.zero_stage)}, where this runtime's FSDP2 "
            "would offload the parameters and gradients with them (CPUOffloadPolicy), which the plan does not "
            "price; plan with ZeRO 0-1 or estimate with --parameter-offload to run it here, or export it to deepspeed"
        )
    if layout.parameter_offload and plan.model.is_moe:
        raise InfeasibleConfigError(
            f"the plan keeps {plan.model.name}'s weight shards on the host, but this runtime holds routed experts "
            "outside FSDP2 (on the device); estimate without --parameter-offload, or search with --no-optimizer-offload"
        )
    if dtype is DType.FP32 and not layout.parameter_offload:
        raise InfeasibleConfigError(
            "the plan offloads optimizer states in fp32 training, where this runtime steps the parameters "
            "themselves (no master copy to offload); plan in bf16 or without --optimizer-offload"
        )


def check_fp8_param_gather(layout: Layout, *, fp8_param_gather: bool) -> None:
    """Refuse an FP8 weight all-gather (``TrainingSpec.fp8_param_gather``) where the runtime
    gathers no weights with FSDP: it is torchao's FSDP2 hook (``enable_fsdp_float8_all_gather``),
    and ZeRO-0/1 (ZeRO-2/3 over one replica included) keep whole weights, gathered, if at all, by
    the runtime's own optimizer in the training precision.

    Raises:
        InfeasibleConfigError: naming the ZeRO stage and the fix.
    """
    if fp8_param_gather and not layout.shards_over_replicas:
        raise InfeasibleConfigError(
            f"--fp8-param-gather with zero_stage={int(layout.zero_stage)} over {layout.dense_replicas} replica(s): "
            "this runtime all-gathers weights in FP8 only through FSDP (ZeRO-2/3 over several replicas); plan "
            "with --zero-stage 3, or drop --fp8-param-gather"
        )


MX_TOKEN_BLOCK = 32
"""Tokens a block of MXFP8's weight-gradient GEMM holds: torchao quantizes that GEMM's operands
(each linear layer's input and output gradient, transposed) in blocks of 32 along the tokens."""


def check_mxfp8_tokens(plan: PlanShape) -> None:
    """Refuse an MXFP8 plan whose linear layers would see a token count MXFP8's weight gradient
    cannot block: a micro-batch's tokens on a rank (b x s / cp) not a multiple of
    ``MX_TOKEN_BLOCK``. (A routed expert, which sees however many tokens route to it, pads them:
    ``runtime.mlp.MLP.row_block``.)

    Raises:
        InfeasibleConfigError: naming the count, and how to plan one that runs.
    """
    run, layout = plan.training.precision.fp8, plan.layout
    if run is None or run.recipe is not Fp8Recipe.MXFP8:
        return
    tokens = layout.micro_batch_size * plan.training.seq_len // layout.context_parallel_degree
    if tokens % MX_TOKEN_BLOCK:
        raise InfeasibleConfigError(
            f"the plan's linear layers see {tokens} tokens a micro-batch on a rank (micro_batch_size x seq_len / cp), "
            f"but mxfp8 quantizes the weight gradient in blocks of {MX_TOKEN_BLOCK} tokens; plan with a --seq-len "
            f"or --micro-batch-size that makes it a multiple of {MX_TOKEN_BLOCK}"
        )


FP8_COMPUTE_CAPABILITY: Mapping[Fp8Devices, tuple[int, int]] = MappingProxyType(
    {Fp8Devices.FP8: (8, 9), Fp8Devices.MXFP8: (10, 0)}
)
"""The lowest CUDA compute capability with the tensor cores each kind of recipe needs: FP8 from
Ada (8.9) and Hopper (9.0), MX block scaling from Blackwell (10.0); torch's ``_scaled_mm``, which
torchao's Float8Linear calls, raises below them."""


def check_fp8_device(plan: PlanShape, capability: tuple[int, int] | None, device_name: str = "") -> None:
    """Refuse an FP8 plan on a CUDA device without the tensor cores its recipe needs, before any
    work (each step would fail in its first FP8 GEMM). ``capability``: the device's CUDA compute
    capability, None on a CPU (where torch emulates the scaled matmul: the runtime runs it there).

    Raises:
        InfeasibleConfigError: naming the recipe, the device and its capability, and the fix.
    """
    run = plan.training.precision.fp8
    if run is None or capability is None:
        return
    needed = FP8_COMPUTE_CAPABILITY[run.devices]
    if capability < needed:
        have, want = ".".join(map(str, capability)), ".".join(map(str, needed))
        raise InfeasibleConfigError(
            f"the plan trains with fp8 recipe {run.recipe.value!r}, which needs {run.devices.value} tensor cores "
            f"(CUDA compute capability {want} or later), but this job's {device_name or 'device'} has {have}; "
            "plan without --fp8 for these devices"
        )


def check_sharded_experts(layout: Layout, *, fp32: bool) -> None:
    """Refuse ZeRO-2/3 beside experts held apart from FSDP (expert parallelism, or folded experts)
    in a precision other than fp32: the experts stay out of FSDP's mixed precision.

    Raises:
        InfeasibleConfigError: naming the ZeRO stage and what runs instead.
    """
    # ZeRO-2/3 over one replica is ZeRO-0 in the runtime (runtime.data_parallel.shards_with_fsdp)
    if layout.zero_stage.shards_gradients and layout.data_parallel_degree > 1 and not fp32:
        raise InfeasibleConfigError(
            f"zero_stage={int(layout.zero_stage)} with expert parallelism runs in fp32 only so far (the "
            "experts stay out of FSDP's mixed precision); train in fp32 or use zero_stage 0 or 1"
        )


def unbuilt_features(model: ModelSpec) -> tuple[str, ...]:
    """What of ``model`` the runtime's decoder (``runtime.model``) does not build, each as a phrase
    naming the feature and its keys; empty when it builds the model as specified (dense and MoE
    layers, experts moe_intermediate_size wide, shared experts and their gate, DeepSeek's first
    dense layers and Qwen-MoE's dense layers, q/k/v biases, q/k norms, group-limited routing,
    DeepSeek's multi-head latent attention)."""
    features = []
    if model.position_embedding_type is PositionEmbedding.ALIBI:
        features.append("ALiBi position biases")
    if model.is_moe and model.has_shared_expert_gate and model.mlp_bias:
        features.append("a gated shared expert with MLP biases (shared_expert_intermediate_size with mlp_bias)")
    return tuple(features)


def check_buildable(model: ModelSpec) -> None:
    """Refuse a model whose layers the runtime would build otherwise than specified (and priced):
    it would train, and its dry run trace, another model (``unbuilt_features``).

    Raises:
        InfeasibleConfigError: one line naming the model, the features and what to do.
    """
    features = unbuilt_features(model)
    if features:
        raise InfeasibleConfigError(
            f"{model.name} uses {' and '.join(features)}, which this runtime does not build; its plans and "
            "estimates hold: train it with a framework that builds it (planner export PLAN --to megatron)"
        )
