"""`planner export plan.json --to torchtitan|megatron|deepspeed` and ``planner.api.export``: each
export parsed back (tomllib, shlex, json) against hand-worked values, and every plan feature a
target cannot express refused in one line (exit code 2), never dropped. Each target's own config
code reads the exports in ``test_exports_frameworks.py``."""

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from export_plans import GPT16
from export_plans import layout as _layout
from export_plans import megatron_words as _megatron
from export_plans import plan as _plan
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.files.plans import save_plan
from planner.schemas import DeviceMap, Layout, MoeDispatcher, Plan, ZeroStage
from planner.schemas.errors import InfeasibleConfigError, SchemaError


def _toml(plan: Plan) -> dict[str, Any]:
    return tomllib.loads(api.export(plan, "torchtitan"))


def _flags(args: list[str]) -> dict[str, str | None]:
    """Megatron's words as {flag: value, or None for a switch}."""
    flags: dict[str, str | None] = {}
    for word in args:
        if word.startswith("--"):
            flags[word] = None
            last = word
        else:
            flags[last] = word
    return flags


# torchtitan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "replicate", "shard", "reshard"),
    [
        (_layout(16, zero_stage=ZeroStage.NONE), 16, 1, None),  # DDP
        (_layout(16, zero_stage=ZeroStage.GRADIENTS), 1, 16, "never"),  # FSDP, ZeRO-2
        (_layout(16, zero_stage=ZeroStage.PARAMETERS), 1, 16, "always"),  # FSDP, ZeRO-3
        (_layout(16, zero_stage=ZeroStage.PARAMETERS, sharding_group_size=8), 2, 8, "always"),  # HSDP
    ],
)
def test_torchtitan_data_parallelism(layout: Layout, replicate: int, shard: int, reshard: str | None) -> None:
    config = _toml(_plan("llama3-8b", layout))
    par = config["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (replicate, shard)
    assert par.get("fsdp_reshard_after_forward") == reshard
    assert config["model"] == {"name": "llama3", "flavor": "8B"}
    # no pipeline: one micro-batch per rank per accumulation step; torchtitan accumulates 64 / (16 x 1) = 4
    assert config["training"]["local_batch_size"] == 1 and config["training"]["global_batch_size"] == 64
    assert config["training"]["mixed_precision_param"] == "bfloat16"


def test_torchtitan_pipeline_states_the_plans_split_and_micro_batches() -> None:
    layout = _layout(
        2,
        tp=2,
        pp=4,
        mb=2,
        zero_stage=ZeroStage.GRADIENTS,
        sequence_parallel=True,
        schedule="interleaved",
        virtual_stages=2,
        layer_split=(1, 2, 2, 2, 2, 2, 2, 3),
        recompute="selective",
    )
    config = _toml(_plan(GPT16, layout))
    par = config["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (2, 4)
    parts = par["module_fqns_per_model_part"]
    assert parts[0] == ["tok_embeddings", "layers.0"]
    assert parts[1] == ["layers.1", "layers.2"]
    assert parts[-1] == ["layers.13", "layers.14", "layers.15", "norm", "output"]
    assert len(parts) == 8
    # through the pipeline a rank takes its replica's whole step: 64 / 2 = 32, in 16 micro-batches of 2
    assert config["training"]["local_batch_size"] == 32
    # priced as 4 schedules a step, it takes 8 a schedule and torchtitan accumulates 64 / (2 x 8) = 4
    flushed = _toml(_plan(GPT16, layout, pipeline_flushes=4))
    assert (flushed["training"]["local_batch_size"], flushed["training"]["global_batch_size"]) == (8, 64)
    assert config["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "model" not in config  # no torchtitan model of that name: the header says so
    assert "[model] name and flavor" in api.export(_plan(GPT16, layout), "torchtitan")


def test_torchtitan_experts() -> None:
    layout = _layout(8, tp=2, zero_stage=ZeroStage.GRADIENTS, sequence_parallel=True, expert_parallel_degree=4)
    par = _toml(_plan("tiny-moe", layout))["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (4, 2)
    folded = _layout(
        8,
        tp=2,
        zero_stage=ZeroStage.GRADIENTS,
        sequence_parallel=True,
        expert_parallel_degree=4,
        expert_tensor_parallel_degree=1,
    )
    config = _toml(_plan("tiny-moe", folded, moe_dispatcher=MoeDispatcher.DEEPEP))
    assert config["parallelism"]["expert_tensor_parallel_degree"] == 1
    assert config["parallelism"]["expert_parallel_comm_backend"] == "deepep"
    assert par["expert_parallel_comm_backend"] == "standard"


def test_torchtitan_overlapped_tensor_parallel_collectives_are_async_tp_with_the_model_compiled() -> None:
    layout = _layout(8, tp=2, zero_stage=ZeroStage.PARAMETERS, sequence_parallel=True)
    assert "compile" not in _toml(
        _plan("tiny-gpt", layout, stack="torchtitan", kernels="eager", loss_method="fp32-eager")
    )  # eager: not compiled ...
    eager_layers = _toml(_plan("tiny-gpt", layout, stack="torchtitan", kernels="eager"))
    assert eager_layers["compile"] == {"enable": True, "components": ["loss"]}  # the stack's fused loss
    config = _toml(_plan("tiny-gpt", layout, stack="torchtitan", kernels="eager", tp_comm_overlap=True))
    assert config["parallelism"]["enable_async_tensor_parallel"] is True
    assert config["compile"] == {"enable": True, "components": ["model", "loss"]}  # ... but async TP needs it


# Megatron-LM --------------------------------------------------------------------------------------


def test_megatron_arguments_of_a_tensor_and_pipeline_plan() -> None:
    layout = _layout(2, tp=2, pp=4, mb=2, zero_stage=ZeroStage.OPTIMIZER, sequence_parallel=True, recompute="full")
    assert _megatron(_plan(GPT16, layout)) == [
        *("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--sequence-parallel"),
        *("--num-layers", "16", "--use-distributed-optimizer"),
        *("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"),
        *("--micro-batch-size", "2", "--global-batch-size", "64", "--seq-length", "128", "--bf16"),
    ]


@pytest.mark.parametrize(
    ("split", "virtual", "want"),
    [
        (None, 1, {}),  # 16 layers over 4 stages: Megatron's own even split
        ((3, 5, 5, 3), 1, {"--decoder-first-pipeline-num-layers": "3", "--decoder-last-pipeline-num-layers": "3"}),
        ((3, 5, 4, 4), 1, {"--pipeline-model-parallel-layout": "Et*3|t*5|t*4|t*4L"}),
        (None, 2, {"--num-layers-per-virtual-pipeline-stage": "2"}),
        ((1, 2, 2, 2, 2, 2, 2, 3), 2, {"--pipeline-model-parallel-layout": "Et|t*2|t*2|t*2|t*2|t*2|t*2|t*3L"}),
    ],
)
def test_megatron_pipeline_split(split: tuple[int, ...] | None, virtual: int, want: dict[str, str]) -> None:
    schedule = "interleaved" if virtual > 1 else "1f1b"
    layout = _layout(2, tp=2, pp=4, layer_split=split, schedule=schedule, virtual_stages=virtual)
    flags = _flags(_megatron(_plan(GPT16, layout)))
    split_flags = {
        k: v for k, v in flags.items() if "pipeline-num-layers" in k or "layout" in k or "virtual-pipeline" in k
    }
    assert split_flags == want


def test_megatron_sharding_and_experts() -> None:
    hsdp = _flags(_megatron(_plan("tiny-gpt", _layout(16, zero_stage=ZeroStage.OPTIMIZER, sharding_group_size=4))))
    assert hsdp["--num-distributed-optimizer-instances"] == "4"  # 16 / 4 replicated optimizer instances
    zero3 = _flags(_megatron(_plan("tiny-gpt", _layout(16, zero_stage=ZeroStage.PARAMETERS), dtype="fp16")))
    assert zero3["--data-parallel-sharding-strategy"] == "optim_grads_params" and "--use-megatron-fsdp" in zero3
    assert "--fp16" in zero3 and "--bf16" not in zero3
    layout = _layout(8, tp=2, sequence_parallel=True, expert_parallel_degree=4, expert_tensor_parallel_degree=1, mb=2)
    moe = _flags(_megatron(_plan("tiny-moe", layout, moe_capacity_factor=1.25, moe_dispatcher=MoeDispatcher.DEEPEP)))
    assert moe["--num-experts"] == "4" and moe["--moe-router-topk"] == "2"
    assert (moe["--expert-model-parallel-size"], moe["--expert-tensor-parallel-size"]) == ("4", "1")
    assert moe["--moe-token-dispatcher-type"] == "flex" and "--moe-enable-deepep" in moe
    assert moe["--moe-expert-capacity-factor"] == "1.25"


def test_megatron_names_the_recompute_modules_where_they_are_not_its_default() -> None:
    layout = _layout(16, recompute="selective", recompute_modules=("moe", "layernorm"))
    args = _megatron(_plan("tiny-moe", layout))
    at = args.index("--recompute-modules")
    assert args[at - 2 : at + 3] == ["--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe"]
    assert "--recompute-modules" not in _megatron(_plan("tiny-moe", _layout(16, recompute="selective")))


def test_context_parallelism_in_megatron_and_torchtitan() -> None:
    # 16 ranks: dp 4 x cp 4; torchtitan's FSDP shards over dp_shard x cp, as ZeRO over the d cp data axis.
    par = _toml(_plan("llama3-8b", _layout(4, zero_stage=ZeroStage.PARAMETERS, context_parallel_degree=4)))[
        "parallelism"
    ]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, 4)
    assert par["context_parallel_degree"] == 4
    grouped = _layout(4, zero_stage=ZeroStage.GRADIENTS, context_parallel_degree=4, sharding_group_size=8)
    par = _toml(_plan("llama3-8b", grouped))["parallelism"]  # 16 / 8 replicas of groups of 8 = 2 dp_shard x 4 cp
    assert (
        par["data_parallel_replicate_degree"],
        par["data_parallel_shard_degree"],
        par["context_parallel_degree"],
    ) == (
        2,
        2,
        4,
    )
    assert _toml(_plan("llama3-8b", _layout(16, zero_stage=3)))["parallelism"]["context_parallel_degree"] == 1
    flags = _flags(_megatron(_plan("tiny-gpt", _layout(4, tp=2, context_parallel_degree=2, zero_stage=1))))
    assert flags["--context-parallel-size"] == "2" and flags["--cp-comm-type"] == "p2p"
    assert flags["--tensor-model-parallel-size"] == "2"
    # The all-to-all kind is Megatron-Core's a2a (DeepSpeed-Ulysses): tiny-gpt's 4 heads, 2 a tp rank, over cp 2.
    a2a = _layout(4, tp=2, context_parallel_degree=2, context_parallel_kind="all-to-all", zero_stage=1)
    flags = _flags(_megatron(_plan("tiny-gpt", a2a)))
    assert flags["--context-parallel-size"] == "2" and flags["--cp-comm-type"] == "a2a"
    # The distributed optimizer shards over the data-and-context group: dp 1 x cp 16 still shards.
    alone = _flags(_megatron(_plan("tiny-gpt", _layout(1, context_parallel_degree=16, zero_stage=1), batch=4)))
    assert "--use-distributed-optimizer" in alone and "--num-distributed-optimizer-instances" not in alone
    assert "--context-parallel-size" not in _flags(_megatron(_plan("tiny-gpt", _layout(16, zero_stage=1))))


# DeepSpeed ----------------------------------------------------------------------------------------


def test_deepspeed_config() -> None:
    layout = _layout(16, mb=2, zero_stage=ZeroStage.PARAMETERS, secondary_partition_size=8, recompute="full")
    config = json.loads(api.export(_plan("llama3-8b", layout), "deepspeed"))
    assert config["train_batch_size"] == 64
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 2  # 64 / (16 x 2)
    assert config["zero_optimization"] == {"stage": 3, "zero_hpz_partition_size": 8}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert "activation_checkpointing" in config


# refusals -----------------------------------------------------------------------------------------

REFUSED = {
    "torchtitan-zero1": ("torchtitan", lambda: _plan("tiny-gpt", _layout(16, zero_stage=1)), "ZeRO-1"),
    "torchtitan-ddp-with-pipeline": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(8, pp=2)),
        "ZeRO-0 data parallelism beside tensor or pipeline parallelism",
    ),
    "torchtitan-fp16": ("torchtitan", lambda: _plan("tiny-gpt", _layout(16), dtype="fp16"), "dtype=fp16"),
    "torchtitan-in-place-loss": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3), stack="torchtitan", loss_method="fp32-in-place"),
        "a fp32-in-place loss",
    ),
    "megatron-fused-loss": ("megatron", lambda: _plan("tiny-gpt", _layout(16), loss_method="fused"), "a fused loss"),
    "torchtitan-selective-modules": (
        "torchtitan",
        lambda: _plan(
            "tiny-gpt",
            _layout(16, zero_stage=3, recompute="selective"),
            stack="torchtitan",
            selective_recompute="modules",
        ),
        "selective recompute of the layout's modules",
    ),
    "megatron-selective-per-op": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(16, recompute="selective"), selective_recompute="every-other-matmul"),
        "selective recompute as every-other-matmul",
    ),
    "torchtitan-bf16-reduce": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3), grad_reduce_dtype="bf16"),
        "gradients summed in bf16",
    ),
    "torchtitan-tp-without-sp": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(8, tp=2, zero_stage=3)),
        "--sequence-parallel",
    ),
    "torchtitan-hpz": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, secondary_partition_size=8)),
        "(hpZ)",
    ),
    "torchtitan-ep-ddp": ("torchtitan", lambda: _plan("tiny-moe", _layout(16, expert_parallel_degree=4)), "ZeRO-0"),
    "torchtitan-capacity-factor": (
        "torchtitan",
        lambda: _plan("tiny-moe", _layout(16, zero_stage=3, expert_parallel_degree=4), moe_capacity_factor=1.25),
        "dropless",
    ),
    "megatron-zero3-pipeline": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(8, pp=2, zero_stage=3)),
        "ZeRO-3 with a pipeline",
    ),
    "megatron-hsdp-zero3": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, sharding_group_size=8)),
        "HSDP (sharding_group_size=8) under ZeRO-3",
    ),
    "megatron-deepep-padding": (
        "megatron",
        lambda: _plan(
            "tiny-moe",
            _layout(8, tp=2, sequence_parallel=True, expert_parallel_degree=4),
            moe_capacity_factor=1.25,
            moe_pad_to_capacity=True,
            moe_dispatcher=MoeDispatcher.DEEPEP,
        ),
        "padded to capacity with the DeepEP dispatcher",
    ),
    "megatron-gpipe": ("megatron", lambda: _plan("tiny-gpt", _layout(8, pp=2, schedule="gpipe")), "GPipe"),
    "megatron-vocabulary": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(8, pp=2, vocabulary_layout="vocab-2")),
        "--vocabulary-layout pinned",
    ),
    "torchtitan-cp-ddp": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(8, context_parallel_degree=2)),
        "context parallelism (cp=2) under ZeRO-0",
    ),
    "torchtitan-cp-small-groups": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(4, zero_stage=3, context_parallel_degree=4, sharding_group_size=2)),
        "in sharding groups of 2",
    ),
    "deepspeed-cp": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(8, context_parallel_degree=2)),
        "Ulysses",
    ),
    "megatron-a2a-kv-heads": (  # llama3-8b's 8 kv heads over tp 4: 2 a rank, cp 4
        "megatron",
        lambda: _plan(
            "llama3-8b", _layout(1, tp=4, context_parallel_degree=4, context_parallel_kind="all-to-all", zero_stage=1)
        ),
        "with 2 key/value heads a tensor-parallel rank",
    ),
    "deepspeed-cp-all-to-all": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(8, context_parallel_degree=2, context_parallel_kind="all-to-all")),
        "its config has no sequence-parallel size",
    ),
    "torchtitan-cp-all-to-all": (
        "torchtitan",
        lambda: _plan(
            "tiny-gpt", _layout(4, zero_stage=3, context_parallel_degree=4, context_parallel_kind="all-to-all")
        ),
        "attention is never split by heads",
    ),
    "deepspeed-tp": ("deepspeed", lambda: _plan("tiny-gpt", _layout(8, tp=2)), "tensor parallelism (degree 2)"),
    "deepspeed-pp": ("deepspeed", lambda: _plan("tiny-gpt", _layout(8, pp=2)), "--pp 1"),
    "megatron-pipeline-flushes": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(8, pp=2), pipeline_flushes=2),
        "pipeline_flushes=2: it runs all of a step's micro-batches in one pipeline schedule",
    ),
    "deepspeed-hsdp": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, sharding_group_size=8)),
        "HSDP",
    ),
    "deepspeed-capacity-factor": (
        "deepspeed",
        lambda: _plan("tiny-moe", _layout(16, zero_stage=3), moe_capacity_factor=1.25),
        "--capacity-factor",
    ),
    "torchtitan-recompute-modules": (
        "torchtitan",
        lambda: _plan("tiny-moe", _layout(16, recompute="selective", recompute_modules=("layernorm", "moe"))),
        "selective recompute of layernorm+moe",
    ),
    "deepspeed-selective": ("deepspeed", lambda: _plan("tiny-gpt", _layout(16, recompute="selective")), "selective"),
    "megatron-offload-fsdp": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, optimizer_offload_fraction=0.5)),
        "optimizer states offloaded under ZeRO-3",
    ),
    "megatron-offload-replicated": (
        "megatron",
        lambda: _plan("tiny-gpt", _layout(16, optimizer_offload_fraction=0.5)),
        "offloaded under ZeRO-0 over 16 replicas",
    ),
    "deepspeed-offload-ratio-zero1": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=1, optimizer_offload_fraction=0.5)),
        "ratio below 1 needs ZeRO-3",
    ),
    "deepspeed-offload-replicated": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(16, optimizer_offload_fraction=1.0)),
        "offloaded without ZeRO over 16 replicas",
    ),
    "torchtitan-offload": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, optimizer_offload_fraction=1.0)),
        "CPUOffloadPolicy",
    ),
    "deepspeed-activation-offload": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(16, activation_offload_layers=1)),
        "activations offloaded from 1 layers",
    ),
    "torchtitan-activation-offload": (
        "torchtitan",
        lambda: _plan("tiny-gpt", _layout(16, zero_stage=3, activation_offload_layers=1)),
        "its trainer offloads no activations",
    ),
    "deepspeed-device-map": (
        "deepspeed",
        lambda: _plan("tiny-gpt", _layout(16, device_map=DeviceMap(devices=tuple(reversed(range(16)))))),
        "device map",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_feature_the_target_cannot_express_is_refused(case: str) -> None:
    target, make, fragment = REFUSED[case]
    with pytest.raises(InfeasibleConfigError, match=r"cannot express") as refused:
        api.export(make(), target)
    message = str(refused.value)
    assert message.startswith(f"{target} cannot express") and fragment in message and "\n" not in message


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(SchemaError, match="not one of torchtitan, megatron, deepspeed"):
        api.export(_plan("tiny-gpt", _layout(16)), "colossalai")


# the command line ---------------------------------------------------------------------------------


def test_cli_prints_or_writes_each_export(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(_plan("tiny-gpt", _layout(16, zero_stage=ZeroStage.PARAMETERS)), path)
    for target in ("torchtitan", "megatron", "deepspeed"):
        printed = CliRunner().invoke(app, ["export", str(path), "--to", target])
        assert printed.exit_code == 0, printed.output
        assert printed.stdout == api.export(path, target)
        out = tmp_path / f"{target}.out"
        written = CliRunner().invoke(app, ["export", str(path), "--to", target, "--output", str(out)])
        assert written.exit_code == 0 and out.read_text() == printed.stdout


@pytest.mark.parametrize("split", [None, (3, 5, 4, 4)])  # the second needs a quoted layout string
def test_megatron_export_pastes_and_reads_with_cat(tmp_path: Path, split: tuple[int, ...] | None) -> None:
    """``pretrain_gpt.py $(cat megatron.args)`` and a paste after ``pretrain_gpt.py \\`` both pass
    Megatron-LM only flags and values: no comment or continuation backslash among them."""
    path, out = tmp_path / "plan.json", tmp_path / "megatron.args"
    save_plan(_plan(GPT16, _layout(2, tp=2, pp=4, layer_split=split)), path)
    result = CliRunner().invoke(app, ["export", str(path), "--to", "megatron", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "Megatron-LM core_v0.15.0 arguments" in result.stderr  # the note goes beside the file
    text = out.read_text()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line: pastes after a backslash
    words = shlex.split(text)
    for before, word in zip(["--", *words], words, strict=False):
        assert word.startswith("--") or before.startswith("--"), (before, word, text)
        assert not word.startswith(("#", "\\")), text
    assert words[:4] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4"]
    if split is None:
        assert text.split() == words  # $(cat ...) splits on white space and strips no quotes
    else:
        assert _flags(words)["--pipeline-model-parallel-layout"] == "Et*3|t*5|t*4|t*4L"


def test_cli_refusal_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(_plan("tiny-gpt", _layout(8, tp=2)), path)
    out = tmp_path / "ds.json"
    args = [sys.executable, "-m", "planner", "export", str(path), "--to", "deepspeed", "--output", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("error: deepspeed cannot express tensor parallelism") and proc.stderr.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("target", "name"), [("torchtitan", "job.toml"), ("megatron", "megatron.args"), ("deepspeed", "ds_config.json")]
)
def test_an_output_folder_is_refused_with_the_targets_own_file_name(tmp_path: Path, target: str, name: str) -> None:
    path = tmp_path / "plan.json"
    save_plan(_plan("tiny-gpt", _layout(16)), path)
    result = CliRunner().invoke(app, ["export", str(path), "--to", target, "--output", str(tmp_path)])
    assert isinstance(result.exception, SchemaError)
    assert f"give a file in it, e.g. '{tmp_path / name}'" in str(result.exception)


def test_an_offload_is_each_targets_own_switch() -> None:
    weights = _plan("tiny-gpt", _layout(16, zero_stage=3, optimizer_offload_fraction=1.0, parameter_offload=True))
    assert tomllib.loads(api.export(weights, "torchtitan"))["training"]["enable_cpu_offload"] is True
    zero = json.loads(api.export(weights, "deepspeed"))["zero_optimization"]
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    share = _plan("tiny-gpt", _layout(16, zero_stage=3, optimizer_offload_fraction=0.25))
    assert json.loads(api.export(share, "deepspeed"))["zero_optimization"]["offload_optimizer"]["ratio"] == 0.25
    one_replica = _plan(GPT16, _layout(1, tp=2, pp=8, optimizer_offload_fraction=0.5))
    words = api.export(one_replica, "megatron").split()
    assert {"--use-distributed-optimizer", "--use-precision-aware-optimizer", "--optimizer-cpu-offload"} <= set(words)
    assert words[words.index("--optimizer-offload-fraction") + 1] == "0.5"
    activations = api.export(_plan("tiny-gpt", _layout(16, activation_offload_layers=1)), "megatron").split()
    assert activations[activations.index("--cpu-offloading-num-layers") + 1] == "1"
