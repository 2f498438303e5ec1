"""A plan as a DeepSpeed config (JSON), for ``deepspeed.initialize(..., config=...)``.

Key names are DeepSpeed 0.19.8's (``deepspeed/runtime/config.py``, ``runtime/zero/config.py``,
whose ZeRO section refuses unknown keys).

What a DeepSpeed config expresses is data parallelism: ZeRO's stage (0-3) and ZeRO++'s
hierarchical partition of ZeRO-3's weights (``zero_hpz_partition_size``, the plan's
secondary_partition_size), the batch (``train_micro_batch_size_per_gpu`` b,
``gradient_accumulation_steps`` B / (d b), ``train_batch_size`` B) and the precision (bf16 or
fp16 with fp32 master weights, fp32 as neither). Tensor, pipeline and expert parallelism are
built by the model code (Megatron-DeepSpeed, DeepSpeed's PipelineModule and MoE layers), not by
the config, and are refused, as is a capacity factor of MoE layers; so is context parallelism: the ring
is not DeepSpeed's scheme, and its sequence parallelism (Ulysses), which is the all-to-all kind,
is not in its config (the model code wraps attention and hands DeepSpeed the groups); so is HSDP, whose DeepSpeed
form (MiCS) 0.19.8 removed. Full recompute is the ``activation_checkpointing`` section, which configures
``deepspeed.checkpointing.checkpoint``: the model's layers must call it. Selective recompute has
no DeepSpeed form and is refused. ``communication_data_type`` is written where the plan sums
gradients in another precision than it trains in (DeepSpeed's default: the engine's
``communication_data_type``). An offloaded optimizer is ZeRO-Offload's ``offload_optimizer``
section (device cpu, pinned), with its ``ratio`` where the plan offloads a fraction below 1, which
DeepSpeed allows under ZeRO-3 only (ZeRO-Offload++; its ``zero/config.py`` refuses the rest); it
runs in ZeRO's optimizer, so over one data-parallel rank ZeRO-0 is written as stage 1 (the same
states), and over several it is refused. A weight offload (``parameter_offload``, ZeRO-3) is
``offload_param`` beside it.
The optimizer and its schedule are left to the user (ZeRO-Offload steps with DeepSpeedCPUAdam).
"""

import json

from planner.export.common import check_common, micro_batches, refuse
from planner.schemas import ContextParallelKind, DType, Plan, Recompute, ZeroStage
from planner.schemas.plan import PlanShape

TARGET = "deepspeed"
VERSION = "0.19.8"

JsonValue = int | float | bool | str | dict[str, "JsonValue"]
COMMUNICATION_TYPES = {DType.FP32: "fp32", DType.BF16: "bf16", DType.FP16: "fp16"}
"""``communication_data_type``'s names (DeepSpeed's config.py ``get_communication_data_type``)."""


def deepspeed_config(plan: Plan) -> dict[str, JsonValue]:
    """The DeepSpeed config of the plan.

    Raises:
        InfeasibleConfigError: the plan uses a feature a DeepSpeed config cannot express (the message says which).
    """
    check(plan)
    layout, training = plan.layout, plan.training
    fraction = layout.optimizer_offload_fraction
    # ZeRO-Offload runs in ZeRO's optimizer: over one replica (``check``), stage 1 holds what stage 0 does
    stage = 1 if fraction > 0 and layout.zero_stage is ZeroStage.NONE else int(layout.zero_stage)
    zero: dict[str, JsonValue] = {"stage": stage}
    if layout.secondary_partition_size is not None:
        zero["zero_hpz_partition_size"] = layout.secondary_partition_size
    if fraction > 0:
        offload: dict[str, JsonValue] = {"device": "cpu", "pin_memory": True}
        if fraction < 1:
            offload["ratio"] = fraction
        zero["offload_optimizer"] = offload
    if layout.parameter_offload:  # ZeRO-3's weight partitions on the host too (ZeRO-Infinity's CPU tier)
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, JsonValue] = {
        "train_batch_size": training.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": micro_batches(plan),
        "zero_optimization": zero,
        "bf16": {"enabled": training.dtype is DType.BF16},
        "fp16": {"enabled": training.dtype is DType.FP16},
    }
    if training.reduce_dtype is not training.dtype:  # DeepSpeed sums gradients in the training precision
        config["communication_data_type"] = COMMUNICATION_TYPES[training.reduce_dtype]
    if layout.recompute is Recompute.FULL:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
        }
    return config


def check(plan: PlanShape) -> None:
    """Refuse what a DeepSpeed config cannot express (``planner search --stack deepspeed`` leaves
    such layouts out).

    Raises:
        InfeasibleConfigError: one line naming the feature, why, and what to plan instead.
    """
    check_common(plan, TARGET)
    layout = plan.layout
    for name, flag, degree in (
        ("tensor parallelism", "--tp", layout.tensor_parallel_degree),
        ("pipeline parallelism", "--pp", layout.pipeline_parallel_degree),
        ("expert parallelism", "--ep", layout.expert_parallel_degree),
    ):
        if degree > 1:
            refuse(
                TARGET,
                f"{name} (degree {degree})",
                "its config holds data parallelism; the model code builds the rest",
                f"export to megatron or torchtitan, or plan with {flag} 1",
            )
    if layout.context_parallel_degree > 1 and layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL:
        refuse(
            TARGET,
            f"all-to-all context parallelism (cp={layout.context_parallel_degree}, DeepSpeed's Ulysses)",
            f"its config has no sequence-parallel size in DeepSpeed {VERSION}: the model code wraps attention "
            "(DistributedAttention, UlyssesSPAttentionHF) and passes the sequence-parallel groups as "
            "deepspeed.initialize's mpu",
            "export to megatron, or build Ulysses in the model code with this config for the rest",
        )
    if layout.context_parallel_degree > 1:
        refuse(
            TARGET,
            f"context parallelism (cp={layout.context_parallel_degree}, ring attention)",
            "its sequence parallelism (Ulysses) splits attention heads with all-to-alls, not the sequence in a ring",
            "export to megatron or torchtitan, plan with --cp-kind all-to-all and build Ulysses in the model code, "
            "or plan with --cp 1",
        )
    if layout.sharding_group_size is not None:
        refuse(
            TARGET,
            f"HSDP (sharding_group_size={layout.sharding_group_size})",
            f"ZeRO shards over every data-parallel rank in DeepSpeed {VERSION} (MiCS was removed)",
            "search with --no-hierarchical-sharding, estimate without --sharding-group-size, or export to torchtitan",
        )
    if plan.training.moe_capacity_factor is not None:
        refuse(
            TARGET,
            f"moe_capacity_factor={plan.training.moe_capacity_factor:g}",
            "its config does not build the MoE layers, whose code sets their capacity",
            "plan without --capacity-factor",
        )
    if layout.recompute_layers is not None:
        refuse(
            TARGET,
            f"full recompute of {list(layout.recompute_layers)} layers on the pipeline stages",
            "deepspeed.checkpointing checkpoints whatever the model's code wraps, which the config does not say",
            "plan with full recompute of every layer, or export to megatron (the same count on every stage)",
        )
    if layout.recompute is Recompute.SELECTIVE:
        refuse(
            TARGET,
            "selective recompute",
            "deepspeed.checkpointing recomputes whole modules",
            "plan with --recompute none or full",
        )
    fraction = layout.optimizer_offload_fraction
    if fraction > 0 and layout.zero_stage is ZeroStage.NONE and layout.dense_replicas > 1:
        refuse(
            TARGET,
            f"optimizer states offloaded without ZeRO over {layout.dense_replicas} replicas",
            "offload_optimizer runs in ZeRO's optimizer, which shards the states over the replicas",
            "plan with --zero-stage 1-3",
        )
    if layout.activation_offload_layers:
        refuse(
            TARGET,
            f"activations offloaded from {layout.activation_offload_layers} layers",
            "its activation_checkpointing.cpu_checkpointing offloads the inputs full recompute keeps, not what a "
            "layer keeps without recompute",
            "estimate without --activation-offload, or export to megatron",
        )
    if 0 < fraction < 1 and layout.zero_stage is not ZeroStage.PARAMETERS:
        refuse(
            TARGET,
            f"{fraction:g} of the optimizer states offloaded under ZeRO-{int(layout.zero_stage)}",
            "offload_optimizer's ratio below 1 needs ZeRO-3 (ZeRO-Offload++)",
            "plan with --zero-stage 3, or offload every optimizer state (--optimizer-offload 1)",
        )


def deepspeed_json(plan: Plan) -> str:
    """The config as JSON text (JSON has no comments: its version is this module's).

    Raises:
        InfeasibleConfigError: as :func:`deepspeed_config`.
    """
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"
