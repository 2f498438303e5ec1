"""What the commands share: their common options, the parsing of options into the API's
inputs, and a progress bar the API reports to."""

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from planner import api
from planner.cli.checks import in_range
from planner.cli.layout_options import EVEN_SPLIT, parse_layout_parts
from planner.files.plans import check_cluster, plan_cluster
from planner.flows.rank_errors import report_to_launcher
from planner.schemas import (
    AttentionKernel,
    ClusterProfile,
    ContextParallelKind,
    DType,
    Kernels,
    Layout,
    LossMethod,
    ModelSpec,
    MoeDispatcher,
    PipelineBuffers,
    Recompute,
    RecomputeModule,
    Schedule,
    SelectiveRecompute,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.bounds import MAX_DEVICES
from planner.schemas.choices import RecomputeChoice
from planner.schemas.errors import PlannerError, SchemaError
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.stacks import StackName
from planner.schemas.training import training_from
from planner.search_engine.strategy import Progress as ProgressCallback


class OutputFormat(StrEnum):
    """How a command prints its result."""

    TABLE = "table"
    JSON = "json"


ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Preset name (see `planner presets`) or a config.json / YAML file."),
]
ClusterOpt = Annotated[
    str | None,
    typer.Option("--cluster", "-c", help="Preset NAME:NODES (e.g. dgx-a100-80g:16) or a cluster profile JSON."),
]


GlobalBatchOpt = Annotated[int | None, typer.Option(min=1, help="Sequences per optimizer step.")]
SeqLenOpt = Annotated[int | None, typer.Option(min=1, help="Tokens per sequence.")]


class TrainDType(StrEnum):
    """The precisions a run trains in (``--dtype``; ``schemas.enums.TRAINING_DTYPES``): FP8 is a
    recipe over one of them (``--fp8``)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


DTypeOpt = Annotated[TrainDType, typer.Option(help="bf16/fp16 mean mixed-precision Adam.")]
FP8_HELP = (
    "Run the transformer layers' linear GEMMs under this FP8 recipe, over --dtype bf16 (attention, norms, "
    "embeddings, output layer, router, loss and optimizer stay bf16): delayed, tensorwise and blockwise with "
    "Transformer Engine (megatron-lm, megatron-bridge, llm-foundry: delayed only); tensorwise, rowwise and "
    "rowwise-gw-hp with torchao (planner-runtime, torchtitan, nemo-automodel); mxfp8 on Blackwell only. Needs a "
    "--stack that offers it (planner stacks) [default: none, every GEMM in --dtype]"
)
Fp8Opt = Annotated[Fp8Recipe | None, typer.Option(help=FP8_HELP + ".")]
Fp8ChoicesOpt = Annotated[
    str | None,
    typer.Option(
        "--fp8",
        metavar="RECIPE[,RECIPE...]",
        help=FP8_HELP + "; a comma-separated list, none for no FP8, searches each and ranks them together "
        "(e.g. none,tensorwise,rowwise).",
    ),
]


def parse_fp8_choices(text: str | None) -> tuple[Fp8Recipe | None, ...]:
    """The recipes of ``search --fp8`` (None for ``none``); () where none was given.

    Raises:
        SchemaError: a name that is no recipe, with the names there are.
    """
    if text is None:
        return ()
    choices: list[Fp8Recipe | None] = []
    for word in (w.strip() for w in text.split(",")):
        if word == "none":
            choices.append(None)
            continue
        try:
            choices.append(Fp8Recipe(word))
        except ValueError:
            names = ", ".join(["none", *Fp8Recipe])
            raise SchemaError(f"--fp8 {word!r} is not an FP8 recipe; give one or more of {names}") from None
    return tuple(choices)


Fp8Bf16LayersOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="With --fp8: keep the first and the last N transformer layers in bf16 (Megatron-LM's "
        "--first-last-layers-bf16; Megatron Bridge's current-scaling recipes keep 1 and 1) [default: 0].",
    ),
]
Fp8ParamGatherOpt = Annotated[
    bool | None,
    typer.Option(
        "--fp8-param-gather/--no-fp8-param-gather",
        help="With --fp8: all-gather sharded weights in FP8 and hold them so (Megatron-LM's --fp8-param-gather, "
        "torchao's FSDP float8 all-gather): per-tensor and blockwise recipes only [default: off].",
    ),
]
Fp8ExpertsOpt = Annotated[
    bool | None,
    typer.Option(
        "--fp8-experts/--no-fp8-experts",
        help="With --fp8 and an MoE model: run the routed experts' GEMMs in FP8 too. Transformer Engine's stacks and "
        "the planner's runtime always do; torchtitan only with its grouped-GEMM converters ([quantize.grouped_mm]), "
        "under rowwise or mxfp8 [default: the stack's].",
    ),
]
ATTENTION_HELP = (
    "Attention kernel: flash (FlashAttention-2, PyTorch's SDPA), cudnn (cuDNN's fused attention, Transformer "
    "Engine's default on Hopper; priced at the cluster's cuDNN figures where it has them, else at flash's), or "
    "eager (the s x s scores kept)"
)
AttentionOpt = Annotated[AttentionKernel | None, typer.Option(help=ATTENTION_HELP + " [default: the stack's].")]
PipelineFlushesOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Pipeline schedules each step runs its micro-batches in, gradients accumulated between them: the "
        "gradient accumulation steps of torchtitan or NeMo AutoModel under pipeline parallelism (one schedule per "
        "local batch), each filling and draining the pipeline; Megatron-LM runs one, the planner's runtime "
        "either [default: the stack's].",
    ),
]
PipelineBuffersOpt = Annotated[
    PipelineBuffers | None,
    typer.Option(
        help="Where pipeline stages receive activations and gradients: per-micro-batch as torch.distributed."
        "pipelining keeps a buffer per micro-batch of the schedule for the run (this planner's runtime, torchtitan, "
        "NeMo AutoModel), per-transfer as Megatron-LM allocates each for its transfer (for a plan exported to it) "
        "[default: the stack's].",
    ),
]
StackOpt = Annotated[
    StackName | None,
    typer.Option(
        help="The training framework the plan is for: it sets how the step runs (kernels, attention, overlaps, "
        "pipeline buffers, gradient-reduce precision; `planner stacks` lists each value and its source), and the "
        "options below change one behaviour of it [default: planner-runtime, what `planner run` runs].",
    ),
]
KERNELS_HELP = (
    "How the elementwise work around the GEMMs runs: fused (norms, activations, rotary, loss and optimizer step "
    "one kernel each: Transformer Engine, Megatron-Core, torch.compile) or eager (one kernel per tensor operation, "
    "as eager PyTorch and this planner's own runtime run them)"
)
KernelsOpt = Annotated[Kernels | None, typer.Option(help=KERNELS_HELP + " [default: the stack's].")]
LossKernelsOpt = Annotated[
    Kernels | None,
    typer.Option(
        help="How the loss runs where it differs from --kernels: eager as Megatron-LM computes it without "
        "--cross-entropy-loss-fusion (its default) [default: the stack's]."
    ),
]
LossMethodOpt = Annotated[
    LossMethod | None,
    typer.Option(
        help="What the loss keeps per logit: fp32-in-place (Megatron-LM, planner run), fp32-eager (torch's "
        "cross_entropy over fp32 logits, 12 bytes a logit at its worst: an uncompiled loss), eager (the same over "
        "bf16 logits), fused (torch.compile, flash-attn) [default: the stack's].",
    ),
]
SelectiveRecomputeOpt = Annotated[
    SelectiveRecompute | None,
    typer.Option(
        help="What --recompute selective keeps and re-runs: modules (the --recompute-modules, Megatron-Core's), "
        "every-other-matmul (torchtitan's per-op policy: the attention's and every other matmul's outputs kept) "
        "[default: the stack's].",
    ),
]
CapacityOpt = Annotated[
    float | None,
    typer.Option(
        callback=in_range(0.01),
        help="MoE: each expert takes at most this many times its even share of a rank's routed tokens and drops "
        "the rest (e.g. 1.25; Megatron-LM's --moe-expert-capacity-factor) [default: dropless].",
    ),
]
PadOpt = Annotated[
    bool | None,
    typer.Option(
        "--pad-to-capacity/--no-pad-to-capacity",
        help="MoE, with --capacity-factor: every expert computes and exchanges its full capacity [default: off].",
    ),
]
DispatcherOpt = Annotated[
    MoeDispatcher | None,
    typer.Option(
        help="MoE: how tokens reach their experts. alltoall sends every (token, expert) pair (this planner's "
        "runtime); deepep sends a token once to each remote node and forwards it over NVLink (DeepEP, Megatron-Core's "
        "flex dispatcher) [default: the stack's].",
    ),
]
TpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap",
        help="Price tensor-parallel collectives run in chunks behind their GEMMs, as a GPU stack with Megatron-Core's "
        "--tp-comm-overlap or torch's async TP runs them (with sequence parallelism; the planner's own runtime "
        "runs them synchronously) [default: the stack's].",
    ),
]

VocabularyOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--vocabulary-overlap/--no-vocabulary-overlap",
        help="Price a vocabulary split over the pipeline as Vocabulary Parallelism's own schedule runs it (its "
        "authors' Megatron-LM fork: collectives behind the layers, 1-2 more micro-batches in flight); off, as the "
        "planner's own runtime runs it, each pass synchronously [default: the stack's].",
    ),
]

GradReduceOpt = Annotated[
    TrainDType | None,
    typer.Option(
        help="Precision data-parallel ranks sum gradients in: fp32 (Megatron-LM under bf16, torchtitan's FSDP, this "
        "planner's runtime) or the training precision (Megatron-LM's --grad-reduce-in-bf16) [default: the stack's].",
    ),
]


PpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--pp-comm-overlap/--no-pp-comm-overlap",
        help="Price an interleaved pipeline's steady-state sends and receives behind compute, as Megatron-LM runs "
        "them with virtual stages (--overlap-p2p-communication); the transfers that fill and drain the pipeline "
        "stay exposed, and a CPU hides nothing [default: the stack's].",
    ),
]


def search_inputs(model: str | None, cluster: str | None, training: Mapping[str, Any]) -> tuple[str, str, TrainingSpec]:
    """Model, cluster and training of a command that searches, from the TrainingSpec fields of its
    options (``training_fields``); the model, cluster, global batch and sequence length are required."""
    required = {
        "--model": model,
        "--cluster": cluster,
        "--global-batch-size": training.get("global_batch_size"),
        "--seq-len": training.get("seq_len"),
    }
    if missing := [option for option, value in required.items() if value is None]:
        raise SchemaError(f"{', '.join(missing)} required")
    assert model is not None and cluster is not None
    return model, cluster, training_spec(training)


def training_spec(training: Mapping[str, Any]) -> TrainingSpec:
    """The TrainingSpec of the options' fields; a value the options let through but the spec refuses
    (a number out of its range) is a SchemaError naming it."""
    return training_from(training)


TRAINING_OPTIONS = {
    "global_batch_size": "global_batch_size",
    "seq_len": "seq_len",
    "dtype": "dtype",
    "stack": "stack",
    "attention": "attention_kernel",
    "kernels": "kernels",
    "loss_kernels": "loss_kernels",
    "loss_method": "loss_method",
    "selective_recompute": "selective_recompute",
    "capacity_factor": "moe_capacity_factor",
    "pad_to_capacity": "moe_pad_to_capacity",
    "tp_comm_overlap": "tp_comm_overlap",
    "pp_comm_overlap": "pp_comm_overlap",
    "pipeline_flushes": "pipeline_flushes",
    "pipeline_buffers": "pipeline_buffers",
    "vocabulary_overlap": "vocabulary_overlap",
    "grad_reduce_dtype": "grad_reduce_dtype",
    "moe_dispatcher": "moe_dispatcher",
    "fp8": "fp8",
    "fp8_param_gather": "fp8_param_gather",
    "fp8_experts": "fp8_experts",
    "fp8_bf16_layers": "fp8_bf16_layers",
}
"""estimate's options that set a TrainingSpec field: option parameter -> field."""
LAYOUT_OPTIONS = {
    "dp": "data_parallel_degree",
    "tp": "tensor_parallel_degree",
    "pp": "pipeline_parallel_degree",
    "cp": "context_parallel_degree",
    "cp_kind": "context_parallel_kind",
    "ep": "expert_parallel_degree",
    "etp": "expert_tensor_parallel_degree",
    "micro_batch_size": "micro_batch_size",
    "zero_stage": "zero_stage",
    "recompute": "recompute",
    "recompute_modules": "recompute_modules",
    "recompute_layers": "recompute_layers",
    "optimizer_offload": "optimizer_offload_fraction",
    "parameter_offload": "parameter_offload",
    "activation_offload": "activation_offload_layers",
    "sequence_parallel": "sequence_parallel",
    "schedule": "schedule",
    "virtual_stages": "virtual_stages",
    "layer_split": "layer_split",
    "vocabulary_layout": "vocabulary_layout",
    "sharding_group_size": "sharding_group_size",
    "secondary_partition_size": "secondary_partition_size",
    "expert_placement": "expert_placement",
    "device_map": "device_map",
}
"""estimate's options that set a Layout field: option parameter -> field. Every field of Layout
has one (tests/planner/test_estimate_every_field.py prices every plan a search returns from them)."""


def training_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingSpec fields of the options given (by parameter name; None or absent: not given)."""
    fields = {field: options[name] for name, field in TRAINING_OPTIONS.items() if options.get(name) is not None}
    for name in ("dtype", "grad_reduce_dtype"):  # the options' TrainDType as the spec's DType
        if name in fields:
            fields[name] = DType(fields[name])
    return fields


def layout_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The Layout fields of the options given (by parameter name; None: not given), parsed."""
    fields = {field: options[name] for name, field in LAYOUT_OPTIONS.items() if options[name] is not None}
    if "zero_stage" in fields:
        fields["zero_stage"] = ZeroStage(fields["zero_stage"])
    if "layer_split" in fields:
        fields["layer_split"] = _parse_split(fields["layer_split"])
    if "recompute_layers" in fields:
        fields["recompute_layers"] = _parse_counts("--recompute-layers", fields["recompute_layers"], "8,4,2,0")
        recompute = fields.setdefault("recompute", Recompute.FULL)  # the counts are full recompute's
        if recompute is not Recompute.FULL:
            raise SchemaError(
                f"--recompute-layers counts the layers full recompute re-runs, but --recompute is {recompute!s}; "
                "use --recompute full or leave --recompute-layers out"
            )
    if fields.get("parameter_offload"):  # the host steps every state it holds the weights of
        fields.setdefault("optimizer_offload_fraction", 1.0)
    parse_layout_parts(fields)
    if "recompute_modules" in fields:
        fields["recompute_modules"] = parse_recompute_modules(fields["recompute_modules"])
        recompute = fields.setdefault("recompute", Recompute.SELECTIVE)  # the modules imply selective
        if recompute is not Recompute.SELECTIVE:
            raise SchemaError(
                f"--recompute-modules names what selective recompute re-runs, but --recompute is {recompute!s}; "
                "use --recompute selective or leave --recompute-modules out"
            )
    return fields


RECOMPUTE_MODULES_HELP = (
    "What selective recompute re-runs (Megatron-Core's --recompute-modules), a comma list of: core_attn (the "
    "attention core's scores), layernorm (the two norms' outputs), moe_act (the routed experts' activation), "
    "mlp (a dense layer's MLP), moe (an MoE layer's whole block, its dispatch and combine all-to-alls again); "
    "e.g. core_attn,layernorm,moe_act"
)


def parse_recompute_modules(text: str) -> tuple[RecomputeModule, ...]:
    """The modules of a --recompute-modules comma list, in ``RecomputeModule``'s order.

    Raises:
        SchemaError: a name that is no module, or an empty list; the message lists the modules.
    """
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    known = ", ".join(m.value for m in RecomputeModule)
    if not names:
        raise SchemaError(f"--recompute-modules {text!r} names no module; give a comma list of {known}")
    for name in names:
        if name not in {m.value for m in RecomputeModule}:
            raise SchemaError(f"--recompute-modules {text!r}: {name!r} is not one of {known}")
    return tuple(m for m in RecomputeModule if m.value in names)


def _parse_split(text: str) -> tuple[int, ...] | None:
    if text.strip().lower() == EVEN_SPLIT:
        return None
    return _parse_counts("--layer-split", text, "7,9,9,7", f", or {EVEN_SPLIT!r}")


def _parse_counts(option: str, text: str, example: str, alternative: str = "") -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as e:
        raise SchemaError(
            f"{option} {text!r} must be comma-separated whole numbers, e.g. {example}{alternative}"
        ) from e


@dataclass(frozen=True, slots=True)
class Inputs:
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterProfile
    cluster_spec: str
    layout: Layout


_LAYOUT_DEFAULTS: dict[str, Any] = {
    "data_parallel_degree": 1,
    "tensor_parallel_degree": 1,
    "pipeline_parallel_degree": 1,
    "micro_batch_size": 1,
}


def resolve(
    plan_path: Path | None,
    model: str | None,
    cluster: str | None,
    training: Mapping[str, Any],
    layout: Mapping[str, Any],
) -> Inputs:
    """Inputs from the fields the options gave; with a plan file, the plan's for the others."""
    if plan_path is None:
        required = {
            "--model": model,
            "--cluster": cluster,
            "--global-batch-size": training.get("global_batch_size"),
            "--seq-len": training.get("seq_len"),
        }
        missing = [option for option, value in required.items() if value is None]
        if missing or model is None or cluster is None:
            raise SchemaError(f"{', '.join(missing)} required (or --plan, whose values are the defaults)")
        chosen = Layout(**{**_LAYOUT_DEFAULTS, **layout})
        spec = training_spec(training)
        return Inputs(api.load_model(model), spec, api.load_cluster(cluster), cluster, chosen)
    plan = api.load_plan(plan_path)
    cluster_spec = cluster if cluster is not None else plan.cluster.spec
    if cluster is None:  # the plan's own profile: missing or another cluster's is an error
        cluster_profile = plan_cluster(plan)
        assert cluster_profile is not None  # required
    else:  # another cluster on purpose: the plan re-priced there
        cluster_profile = api.load_cluster(cluster_spec)
        check_cluster(plan, cluster_profile)
    return Inputs(
        api.load_model(model) if model is not None else plan.model,
        plan.training.with_options(training),
        cluster_profile,
        cluster_spec,
        replace(plan.layout, **layout),
    )


WIDE_COLUMNS = 200
"""Width of tables written to a file or pipe: wide enough that no plan's row wraps."""


def say_error(error: PlannerError) -> None:
    """Say a user error in one line on stderr; under torchrun also in the rank's error file, and
    there only under `planner launch --run`, which says it once for all ranks
    (``planner.flows.rank_errors``)."""
    if not report_to_launcher(str(error)):
        typer.echo(f"error: {error}", err=True)


def output_console() -> Console:
    """Where a command's tables go: the terminal at its width; redirected to a file or a pipe
    (no terminal to fit), wide enough that every row stays on one line, for people and for grep
    (a COLUMNS setting still decides)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=WIDE_COLUMNS)
    return console


@contextmanager
def progress_bar(description: str, *, transient: bool) -> Iterator[ProgressCallback]:
    """A progress bar on stderr, and the callback (done, total) the API reports to."""
    with Progress(transient=transient, console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


CONSTRAINT_HELP = "a value, a range A-B or a list (e.g. 8, 1-16, 1,2,4)"
IntRangeOpt = Annotated[str | None, typer.Option(help=f"Search only these; {CONSTRAINT_HELP}.")]
CONSTRAINT_AXES: dict[str, tuple[str, type[StrEnum] | type[IntEnum] | None]] = {
    "tp": ("tp", None),
    "pp": ("pp", None),
    "dp": ("dp", None),
    "cp": ("cp", None),
    "cp_kind": ("cp_kind", ContextParallelKind),
    "ep": ("ep", None),
    "micro_batch_size": ("micro_batch_size", None),
    "virtual_stages": ("virtual_stages", None),
    "zero_stage": ("zero_stage", ZeroStage),
    "schedule": ("schedule", Schedule),
    "recompute": ("recompute", Recompute),
}
"""search's constraint options: option parameter -> (search axis, the values' enum, None for numbers)."""


def constraint_fields(options: Mapping[str, Any]) -> dict[str, frozenset[Any]]:
    """The search constraints given among ``options`` (a command's locals), by search axis, each
    parsed from its text (``parse_constraint``); ``max_tp`` adds tp <= it."""
    found: dict[str, frozenset[Any]] = {}
    for param, (axis, kind) in CONSTRAINT_AXES.items():
        text = options.get(param)
        if text is not None:
            found[axis] = parse_constraint("--" + param.replace("_", "-"), str(text), kind)
    modules = options.get("recompute_modules")
    if modules is not None:  # selective tries these modules alone; the other modes stay as allowed
        modes = found.get("recompute", frozenset(Recompute))
        if Recompute.SELECTIVE not in modes:
            raise SchemaError(
                "--recompute-modules names what selective recompute re-runs, but --recompute leaves selective out; "
                "add selective to --recompute or leave --recompute-modules out"
            )
        selective = RecomputeChoice(Recompute.SELECTIVE, parse_recompute_modules(str(modules)))
        found["recompute"] = (modes - {Recompute.SELECTIVE}) | {selective}
    max_tp = options.get("max_tp")
    if max_tp is not None:
        capped = frozenset(range(1, min(int(max_tp), MAX_DEVICES) + 1))  # no cluster has more ranks
        found["tp"] = found["tp"] & capped if "tp" in found else capped
    return found


def parse_constraint(option: str, text: str, kind: type[StrEnum] | type[IntEnum] | None) -> frozenset[Any]:
    """The values ``text`` names: numbers, ranges A-B and comma lists of either; or enum values
    (ZeRO stages as numbers, ranges allowed). Raises SchemaError naming the option and the fix."""
    values: set[Any] = set()
    for part in (p.strip() for p in text.split(",")):
        if kind is not None and issubclass(kind, StrEnum):
            try:
                values.add(kind(part.lower()))
            except ValueError:
                raise SchemaError(
                    f"{option} {text!r}: {part!r} is not one of {', '.join(str(v) for v in kind)}"
                ) from None
            continue
        low, _, high = part.partition("-")
        if not (low.strip().isdigit() and (not high or high.strip().isdigit())):
            raise SchemaError(f"{option} {text!r}: give {CONSTRAINT_HELP}")
        first, last = int(low), int(high or low)
        if first > last:
            raise SchemaError(f"{option} {text!r}: the range {part} runs backwards; write it low-high")
        if last > MAX_DEVICES:
            raise SchemaError(
                f"{option} {text!r}: {last} is more than any degree or micro-batch this planner plans "
                f"(at most {MAX_DEVICES:,})"
            )
        numbers = range(first, last + 1)
        if kind is None:
            values.update(numbers)
            continue
        try:
            values.update(kind(n) for n in numbers)
        except ValueError:
            raise SchemaError(
                f"{option} {text!r}: {kind.__name__} takes {', '.join(str(int(v)) for v in kind)}"
            ) from None
    return frozenset(values)
