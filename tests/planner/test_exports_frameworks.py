"""Each export read by its target's own config code, at the version the export names (the
``exports`` extra, which ``scripts/setup.sh`` installs): a field a target renamed, a value out of
its choices or a combination it refuses fails here, not on a cluster.

- torchtitan 0.2.2: its ConfigManager loads the TOML and refuses unknown sections and keys; it
  checks no value, so each value is checked (typeguard) against the type its JobConfig declares
  for that key. Its ParallelDims checks the degrees over the 16 ranks, and torch's pipelining
  resolves the schedule name as torchtitan's pipeline code does.
- DeepSpeed 0.19.8: DeepSpeedConfig reads the JSON (its ZeRO section refuses unknown keys) and
  checks B = b x accumulation x d, the data-parallel world given by a stand-in model-parallel
  unit and the rank by a stand-in for its process group.
- Megatron-LM core_v0.15.0: its argument parser (``megatron/training/arguments.py``) is not in the
  megatron-core wheel, so the words become its config objects the way Megatron-LM builds them (a
  flag's dest copied onto the config field of that name, plus the renames of its
  ``core_transformer_config_from_args``), and megatron-core's TransformerConfig,
  DistributedDataParallelConfig, OptimizerConfig and micro-batch calculator check them.

Not checked: that Megatron-LM's parser knows each flag's spelling, type and choices (a flag counts
here if its dest is a config field or one of ``_MEGATRON_TRAINING_ONLY``, of which only the batch
sizes are read: --seq-length and --ckpt-format's value go unchecked), and its validate_args
cross-checks outside the config classes (such as the flags Megatron-FSDP requires);
torchtitan's module names per model part (its model code imports its trainer's packages: datasets,
tensorboard) and its trainer's batch and pipeline-stage checks, which need a device mesh.
"""

import dataclasses
import importlib
import importlib.util
import json
import sys
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from export_plans import GPT16, layout, megatron_words, plan

from planner import api
from planner.schemas import MoeDispatcher, Plan, ZeroStage
from planner.schemas.geometry import num_micro_batches

WORLD_SIZE = 16  # export_plans.CLUSTER's devices
NOT_INSTALLED = "is not installed (the exports extra, as scripts/setup.sh installs it)"

# torchtitan ---------------------------------------------------------------------------------------

TORCHTITAN: dict[str, Callable[[], Plan]] = {
    "ddp": lambda: plan("llama3-8b", layout(16, zero_stage=ZeroStage.NONE)),
    "fsdp-cpu-offload": lambda: plan(
        "llama3-8b", layout(16, zero_stage=ZeroStage.PARAMETERS, optimizer_offload_fraction=1.0, parameter_offload=True)
    ),
    "fsdp-zero2-fp32": lambda: plan("llama3-8b", layout(16, zero_stage=ZeroStage.GRADIENTS), dtype="fp32"),
    "hsdp-zero3": lambda: plan("llama3-8b", layout(16, zero_stage=ZeroStage.PARAMETERS, sharding_group_size=8)),
    "context-parallel": lambda: plan(
        "llama3-8b", layout(4, zero_stage=ZeroStage.PARAMETERS, context_parallel_degree=4)
    ),
    "fused-compiled": lambda: plan("llama3-8b", layout(16, zero_stage=ZeroStage.PARAMETERS), stack="torchtitan"),
    "interleaved-async-tp": lambda: plan(
        GPT16,
        layout(2, tp=2, pp=4, zero_stage=3, sequence_parallel=True, schedule="interleaved", virtual_stages=2),
        tp_comm_overlap=True,
    ),
    "1f1b-selective-flushes": lambda: plan(
        GPT16,
        layout(
            2, tp=2, pp=4, mb=2, zero_stage=2, sequence_parallel=True, layer_split=(3, 5, 4, 4), recompute="selective"
        ),
        pipeline_flushes=4,
    ),
    "experts-deepep": lambda: plan(
        "tiny-moe",
        layout(
            8, tp=2, zero_stage=2, sequence_parallel=True, expert_parallel_degree=4, expert_tensor_parallel_degree=1
        ),
        moe_dispatcher=MoeDispatcher.DEEPEP,
    ),
    "fp8-tensorwise-fsdp-gather": lambda: plan(
        "llama3-8b", layout(16, zero_stage=ZeroStage.PARAMETERS), stack="torchtitan", fp8="tensorwise",
        fp8_param_gather=True,
    ),
    "fp8-rowwise-gw-hp-moe": lambda: plan(
        "tiny-moe", layout(16, zero_stage=ZeroStage.GRADIENTS, expert_parallel_degree=4), stack="torchtitan",
        fp8="rowwise-gw-hp",
    ),
    "fp8-rowwise-grouped-experts": lambda: plan(
        "tiny-moe", layout(16, zero_stage=ZeroStage.GRADIENTS, expert_parallel_degree=4), stack="torchtitan",
        fp8="rowwise", fp8_experts=True,
    ),
    "mxfp8-grouped-experts": lambda: plan(
        "tiny-moe", layout(16, zero_stage=ZeroStage.GRADIENTS, expert_parallel_degree=4), blackwell=True,
        stack="torchtitan", fp8="mxfp8", fp8_experts=True,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def torchtitan_config() -> types.ModuleType:
    """``torchtitan.config``, entered without the package's ``__init__``: that imports its float8
    and MoE converters (triton, which only GPU builds of torch bring) and takes seconds; the config
    loader needs neither."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip(f"torchtitan 0.2.2 {NOT_INSTALLED}")
    if "torchtitan" not in sys.modules:
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = package
    return importlib.import_module("torchtitan.config")


@pytest.mark.parametrize("case", sorted(TORCHTITAN))
def test_torchtitan_loads_the_export(case: str, tmp_path: Path, torchtitan_config: types.ModuleType) -> None:
    typeguard = pytest.importorskip("typeguard", reason=f"typeguard (tyro's) {NOT_INSTALLED}")
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.parallel_dims import ParallelDims

    path = tmp_path / "job.toml"
    path.write_text(api.export(TORCHTITAN[case](), "torchtitan"))
    config = torchtitan_config.ConfigManager().parse_args(["--job.config_file", str(path)])
    every_item = typeguard.CollectionCheckStrategy.ALL_ITEMS

    def check_section(section: object, keys: dict[str, Any], name: str) -> None:
        declared = typing.get_type_hints(type(section))
        for key, value in keys.items():
            if dataclasses.is_dataclass(declared[key]):  # a nested section: [quantize.linear.float8]
                check_section(getattr(section, key), value, f"{name}.{key}")
                continue
            typeguard.check_type(value, declared[key], collection_check_strategy=every_item)
            assert getattr(section, key) == value, (name, key)

    for name, keys in tomllib.loads(path.read_text()).items():
        check_section(getattr(config, name), keys, name)
    par = config.parallelism
    ParallelDims(  # asserts the degrees multiply to the world and the expert degrees fit it
        dp_replicate=par.data_parallel_replicate_degree,
        dp_shard=par.data_parallel_shard_degree,
        cp=par.context_parallel_degree,
        tp=par.tensor_parallel_degree,
        pp=par.pipeline_parallel_degree,
        ep=par.expert_parallel_degree,
        etp=par.expert_tensor_parallel_degree,
        world_size=WORLD_SIZE,
    )
    if par.pipeline_parallel_degree > 1:
        get_schedule_class(par.pipeline_parallel_schedule)  # raises on a name torch does not know


# DeepSpeed ----------------------------------------------------------------------------------------

DEEPSPEED: dict[str, Callable[[], Plan]] = {
    "zero0-bf16": lambda: plan("llama3-8b", layout(16, zero_stage=ZeroStage.NONE)),
    "zero1-fp16": lambda: plan("llama3-8b", layout(16, mb=4, zero_stage=ZeroStage.OPTIMIZER), dtype="fp16"),
    "zero2-fp32-recompute": lambda: plan(
        "tiny-gpt", layout(16, zero_stage=ZeroStage.GRADIENTS, recompute="full"), dtype="fp32"
    ),
    "zero3-hpz": lambda: plan("llama3-8b", layout(16, mb=2, zero_stage=3, secondary_partition_size=8)),
    "zero3-experts": lambda: plan("tiny-moe", layout(16, zero_stage=ZeroStage.PARAMETERS)),
    "fp32-reduce": lambda: plan("tiny-gpt", layout(16, zero_stage=1), stack="deepspeed", grad_reduce_dtype="fp32"),
    "zero1-optimizer-offload": lambda: plan("llama3-8b", layout(16, zero_stage=1, optimizer_offload_fraction=1.0)),
    "zero3-parameter-offload": lambda: plan(
        "llama3-8b", layout(16, zero_stage=3, optimizer_offload_fraction=1.0, parameter_offload=True)
    ),
    "zero3-partial-optimizer-offload": lambda: plan(
        "llama3-8b", layout(16, zero_stage=3, optimizer_offload_fraction=0.25)
    ),
}


@pytest.mark.parametrize("case", sorted(DEEPSPEED))
def test_deepspeed_accepts_the_export(case: str) -> None:
    config_module = pytest.importorskip("deepspeed.runtime.config", reason=f"deepspeed 0.19.8 {NOT_INSTALLED}")

    class DataParallel:  # what DeepSpeed asks its model-parallel unit: the data-parallel world
        def get_data_parallel_world_size(self) -> int:
            return exported.layout.data_parallel_degree

    exported = DEEPSPEED[case]()
    raw = json.loads(api.export(exported, "deepspeed"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module.dist, "get_rank", lambda: 0)  # no process group: rank 0
        config = config_module.DeepSpeedConfig(raw, mpu=DataParallel())  # checks B = b x accumulation x d
    training, zero = exported.training, exported.layout.zero_stage
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu) == (
        training.global_batch_size,
        exported.layout.micro_batch_size,
    )
    assert config.gradient_accumulation_steps == num_micro_batches(training.global_batch_size, exported.layout)
    assert config.zero_optimization_stage == int(zero)
    assert (config.bfloat16_config.enabled, config.float16_config.enabled) == (
        training.dtype == "bf16",
        training.dtype == "fp16",
    )
    assert config.zero_config.zero_hpz_partition_size == (exported.layout.secondary_partition_size or 1)
    offload, fraction = config.zero_config.offload_optimizer, exported.layout.optimizer_offload_fraction
    assert (offload is not None and str(offload.device).endswith("cpu") and offload.ratio) == (fraction or False)
    weights = config.zero_config.offload_param
    assert (weights is not None and str(weights.device).endswith("cpu")) == exported.layout.parameter_offload
    # gradients summed as priced under DeepSpeed's stack: the training precision unless the plan says otherwise
    summed = exported.training.under("deepspeed").reduce_dtype
    expected = None if summed == training.dtype else {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[summed]
    assert (config.communication_data_type and str(config.communication_data_type).removeprefix("torch.")) == expected


# Megatron-LM --------------------------------------------------------------------------------------

MEGATRON: dict[str, Callable[[], Plan]] = {
    "interleaved-layout-overlaps": lambda: plan(
        GPT16,
        layout(
            2,
            tp=2,
            pp=4,
            mb=2,
            zero_stage=ZeroStage.OPTIMIZER,
            sequence_parallel=True,
            recompute="full",
            schedule="interleaved",
            virtual_stages=2,
            layer_split=(1, 2, 2, 2, 2, 2, 2, 3),
        ),
        tp_comm_overlap=True,
        pp_comm_overlap=False,
    ),
    "first-last-split": lambda: plan(GPT16, layout(2, tp=2, pp=4, layer_split=(3, 5, 5, 3))),
    "uneven-layout": lambda: plan(GPT16, layout(2, tp=2, pp=4, layer_split=(3, 5, 4, 4))),
    "even-virtual": lambda: plan(GPT16, layout(2, tp=2, pp=4, schedule="interleaved", virtual_stages=2)),
    "partial-distributed-optimizer": lambda: plan("tiny-gpt", layout(16, zero_stage=1, sharding_group_size=4)),
    "optimizer-cpu-offload": lambda: plan("tiny-gpt", layout(16, zero_stage=1, optimizer_offload_fraction=0.5)),
    "optimizer-cpu-offload-one-replica": lambda: plan(GPT16, layout(1, tp=2, pp=8, optimizer_offload_fraction=1.0)),
    "activation-offload": lambda: plan("tiny-gpt", layout(16, zero_stage=1, activation_offload_layers=1)),
    "megatron-fsdp-zero3-fp16": lambda: plan("tiny-gpt", layout(16, zero_stage=3), dtype="fp16"),
    "megatron-fsdp-zero2-tp-fp32": lambda: plan(
        "tiny-gpt", layout(8, tp=2, sequence_parallel=True, zero_stage=2), dtype="fp32"
    ),
    "experts-deepep-capacity": lambda: plan(
        "tiny-moe",
        layout(8, tp=2, mb=2, sequence_parallel=True, expert_parallel_degree=4, expert_tensor_parallel_degree=1),
        moe_capacity_factor=1.25,
        moe_dispatcher=MoeDispatcher.DEEPEP,
    ),
    "experts-padded-alltoall": lambda: plan(
        "tiny-moe", layout(16, expert_parallel_degree=4), moe_capacity_factor=1.5, moe_pad_to_capacity=True
    ),
    "ring-context": lambda: plan("tiny-gpt", layout(4, tp=2, context_parallel_degree=2, zero_stage=1)),
    "all-to-all-context": lambda: plan(
        "tiny-gpt", layout(4, tp=2, context_parallel_degree=2, context_parallel_kind="all-to-all", zero_stage=1)
    ),
    "selective-modules": lambda: plan(
        "tiny-moe", layout(16, recompute="selective", recompute_modules=("moe", "layernorm"))
    ),
    "stack-flags": lambda: plan(  # a fused loss, FlashAttention-2 and a bf16 gradient reduction on megatron-lm
        "tiny-gpt",
        layout(8, tp=2, zero_stage=1),
        stack="megatron-lm",
        loss_kernels=None,
        attention_kernel="flash",
        grad_reduce_dtype="bf16",
    ),
    "eager-attention": lambda: plan("tiny-gpt", layout(16), stack="megatron-lm", attention_kernel="eager"),
    "fp8-delayed-param-gather": lambda: plan(
        "tiny-gpt", layout(16, zero_stage=1), stack="megatron-lm", fp8="delayed", fp8_param_gather=True
    ),
    "fp8-blockwise-moe": lambda: plan(
        "tiny-moe", layout(16, expert_parallel_degree=4), stack="megatron-lm", fp8="blockwise"
    ),
}

_MEGATRON_DESTS = {"--no-overlap-p2p-communication": "overlap_p2p_comm"}
"""Flags whose dest is not their name (in ``arguments.py``); any other --x-y is x_y, --no-x-y x_y = False."""
_MEGATRON_LISTS = {"recompute_modules", "cp_comm_type"}
"""Dests its parser reads as lists (nargs)."""
_MEGATRON_RENAMES = {
    "num_experts": "num_moe_experts",
    "fp8_format": "fp8",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}
"""``core_transformer_config_from_args``'s renames, argument to TransformerConfig field."""
_MEGATRON_TRAINING_ONLY = {"micro_batch_size", "global_batch_size", "seq_length", "ckpt_format"}
"""Arguments Megatron-LM's training loop reads itself: no config class holds them."""


def _megatron_namespace(words: list[str]) -> dict[str, Any]:
    """The words as Megatron-LM's parser would hold them: {dest: value}, a switch True (False for
    --no-), a number as int or float, a nargs value as a list."""
    args: dict[str, Any] = {}
    at = 0
    while at < len(words):
        flag, values = words[at], []
        at += 1
        while at < len(words) and not words[at].startswith("--"):
            values.append(words[at])
            at += 1
        dest = _MEGATRON_DESTS.get(flag) or flag.removeprefix("--").removeprefix("no-").replace("-", "_")
        typed = [int(v) if v.isdigit() else float(v) if v.replace(".", "", 1).isdigit() else v for v in values]
        args[dest] = (typed if dest in _MEGATRON_LISTS else typed[0]) if values else not flag.startswith("--no-")
    return args


@pytest.mark.parametrize("case", sorted(MEGATRON))
def test_megatron_core_accepts_the_export(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core", reason=f"megatron-core 0.15.0 {NOT_INSTALLED}")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig, optimizer_config
    from megatron.core.transformer import transformer_config
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    # An FP8 MoE config and the precision-aware optimizer (optimizer offload) ask Transformer
    # Engine's version, which runs every FP8 export and is not installed here (CUDA-only): stand in
    # a recent one.
    monkeypatch.setattr(transformer_config, "is_te_min_version", lambda *_, **__: True)
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda *_, **__: True)

    exported = MEGATRON[case]()
    args = _megatron_namespace(megatron_words(exported))
    classes = (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig)
    fields = set().union(*map(_names, classes))
    derived = {"num_layers_per_virtual_pipeline_stage", "grad_reduce_in_bf16"}  # validate_args makes fields of them
    assert set(args) - fields - set(_MEGATRON_RENAMES) - _MEGATRON_TRAINING_ONLY - derived == set()

    model, dtype = exported.model, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(exported.training.dtype)
    kwargs = {name: value for name, value in args.items() if name in fields}
    kwargs |= {_MEGATRON_RENAMES[name]: value for name, value in args.items() if name in _MEGATRON_RENAMES}
    if "cp_comm_type" in args:  # one type for every layer is passed on as a string
        kwargs["cp_comm_type"] = args["cp_comm_type"][0]
    if "attention_backend" in args:  # the parser's type: AttnBackend[name]
        kwargs["attention_backend"] = AttnBackend[args["attention_backend"]]
    if args.get("grad_reduce_in_bf16"):  # validate_args: accumulate_allreduce_grads_in_fp32 = False
        kwargs["grad_reduce_in_fp32"] = False
    if "overlap_p2p_comm" in args:
        kwargs["batch_p2p_comm"] = not args["overlap_p2p_comm"]
    if "num_layers_per_virtual_pipeline_stage" in args:  # as validate_args derives it
        per_stage = args["num_layers"] // args["pipeline_model_parallel_size"]
        kwargs["virtual_pipeline_model_parallel_size"] = per_stage // args["num_layers_per_virtual_pipeline_stage"]
    shape = {  # the model's shape, which the export leaves to the user
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.kv_heads,
        "ffn_hidden_size": model.intermediate_size,
        "params_dtype": dtype or torch.float32,
        "pipeline_dtype": dtype or torch.float32,
    }
    if model.is_moe:
        shape["moe_ffn_hidden_size"] = model.moe_intermediate_size or model.intermediate_size
    built = {cls: cls(**{k: v for k, v in {**kwargs, **shape}.items() if k in _names(cls)}) for cls in classes}
    transformer = built[TransformerConfig]  # each __post_init__ checks its combination

    virtual = transformer.virtual_pipeline_model_parallel_size
    assert (virtual or 1) == exported.layout.virtual_stages
    model_parallel = args["tensor_model_parallel_size"] * args["pipeline_model_parallel_size"]
    data_parallel = WORLD_SIZE // (model_parallel * args.get("context_parallel_size", 1))  # as Megatron's groups
    batches = ConstantNumMicroBatchesCalculator(
        args["global_batch_size"], args["micro_batch_size"], data_parallel, False, 0
    )  # asserts B is a multiple of b d
    assert batches.get() == num_micro_batches(exported.training.global_batch_size, exported.layout)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
