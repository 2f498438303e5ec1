"""The ``planner`` command line: a thin layer over ``planner.api``.

A PlannerError (bad input, infeasible layout) prints one line and exits with code 2; any other
exception is a bug and keeps its traceback.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cost_models.layer_work import profile_gemm_shapes
from planner import api
from planner.export.torchrun import launch_script, torchrun_commands
from planner.inputs import list_cluster_presets, list_model_presets, save_cluster
from planner.plans import check_cluster, make_plan
from planner.render import comparison_view, estimate_view, ranked_table
from planner.schemas import (
    AttentionKernel,
    ClusterProfile,
    DType,
    Layout,
    ModelSpec,
    Plan,
    Recompute,
    Schedule,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.errors import PlannerError, SchemaError
from planner.schemas.geometry import rank_of
from planner.search_engine import StrategyName
from planner.search_engine.strategy import Budget
from planner.tuning.settings import Selection

app = typer.Typer(
    help="Plan how to split an LLM's training over a cluster: predict memory and step time of layouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
DTypeOpt = Annotated[DType, typer.Option(help="bf16/fp16 mean mixed-precision Adam.")]
AttentionOpt = Annotated[AttentionKernel, typer.Option(help="Attention kernel.")]


def _search_inputs(
    model: str | None,
    cluster: str | None,
    global_batch_size: int | None,
    seq_len: int | None,
    dtype: DType,
    attention: AttentionKernel,
) -> tuple[str, str, TrainingSpec]:
    """Model, cluster and training of a command that searches; all four inputs are required."""
    required = {"--model": model, "--cluster": cluster, "--global-batch-size": global_batch_size, "--seq-len": seq_len}
    if missing := [option for option, value in required.items() if value is None]:
        raise SchemaError(f"{', '.join(missing)} required")
    assert model is not None and cluster is not None
    training = TrainingSpec.model_validate(
        {"global_batch_size": global_batch_size, "seq_len": seq_len, "dtype": dtype, "attention_kernel": attention}
    )
    return model, cluster, training


def _parse_split(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as e:
        raise SchemaError(f"--layer-split {text!r} must be comma-separated whole numbers, e.g. 7,9,9,7") from e


@dataclass(frozen=True, slots=True)
class _Inputs:
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterProfile
    cluster_spec: str
    layout: Layout


def _resolve(
    plan_path: Path | None,
    model: str | None,
    cluster: str | None,
    training_fields: Mapping[str, object],
    layout_fields: Mapping[str, object],
) -> _Inputs:
    """Inputs from the options; with a plan file, every option not given comes from the plan."""
    given_training = {k: v for k, v in training_fields.items() if v is not None}
    given_layout: dict[str, Any] = {k: v for k, v in layout_fields.items() if v is not None}
    if plan_path is None:
        required = {
            "--model": model,
            "--cluster": cluster,
            "--global-batch-size": training_fields.get("global_batch_size"),
            "--seq-len": training_fields.get("seq_len"),
        }
        missing = [option for option, value in required.items() if value is None]
        if missing or model is None or cluster is None:
            raise SchemaError(f"{', '.join(missing)} required (or --plan, whose values are the defaults)")
        layout = Layout(**{**_LAYOUT_DEFAULTS, **given_layout})
        training = TrainingSpec.model_validate(given_training)
        return _Inputs(api.load_model(model), training, api.load_cluster(cluster), cluster, layout)
    plan = api.load_plan(plan_path)
    cluster_spec = cluster if cluster is not None else plan.cluster.spec
    cluster_profile = api.load_cluster(cluster_spec)
    check_cluster(plan, cluster_profile)
    return _Inputs(
        api.load_model(model) if model is not None else plan.model,
        plan.training.model_copy(update=given_training),
        cluster_profile,
        cluster_spec,
        replace(plan.layout, **given_layout),
    )


_LAYOUT_DEFAULTS: dict[str, Any] = {
    "data_parallel_degree": 1,
    "tensor_parallel_degree": 1,
    "pipeline_parallel_degree": 1,
    "micro_batch_size": 1,
}


@app.command()
def estimate(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    plan: Annotated[
        Path | None,
        typer.Option(help="A plan file: its inputs and layout are the defaults; other options change them."),
    ] = None,
    dp: Annotated[int | None, typer.Option(min=1, help="Data-parallel degree [default: 1].")] = None,
    tp: Annotated[int | None, typer.Option(min=1, help="Tensor-parallel degree [default: 1].")] = None,
    pp: Annotated[int | None, typer.Option(min=1, help="Pipeline-parallel degree [default: 1].")] = None,
    ep: Annotated[
        int | None, typer.Option(min=1, help="Expert-parallel degree (MoE; divides dp) [default: 1].")
    ] = None,
    micro_batch_size: Annotated[int | None, typer.Option(min=1, help="Sequences per micro-batch [default: 1].")] = None,
    zero_stage: Annotated[int | None, typer.Option(min=0, max=3, help="ZeRO stage 0-3 [default: 0].")] = None,
    recompute: Annotated[Recompute | None, typer.Option(help="Activation recomputation [default: none].")] = None,
    sequence_parallel: Annotated[
        bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Needs tp > 1 [default: off].")
    ] = None,
    schedule: Annotated[Schedule | None, typer.Option(help="Pipeline schedule [default: 1f1b].")] = None,
    virtual_stages: Annotated[
        int | None, typer.Option(min=1, help="Model chunks per pipeline rank (interleaved) [default: 1].")
    ] = None,
    layer_split: Annotated[str | None, typer.Option(help="Layers per model chunk, e.g. 7,9,9,7.")] = None,
    dtype: Annotated[DType | None, typer.Option(help="bf16/fp16 mean mixed-precision Adam [default: bf16].")] = None,
    attention: Annotated[AttentionKernel | None, typer.Option(help="Attention kernel [default: flash].")] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table for people, json for tools.")
    ] = OutputFormat.TABLE,
    output: Annotated[Path | None, typer.Option(help="Also write the layout and its estimate as a plan file.")] = None,
) -> None:
    """Predict per-rank memory and step time of one layout.

    Example: planner estimate -m gpt3-175b -c dgx-a100-80g:128 --global-batch-size 1536 --seq-len 2048
    --dp 8 --tp 8 --pp 16 --micro-batch-size 1 --recompute full --schedule interleaved --virtual-stages 2

    Example: planner estimate --plan plan.json --tp 4 --dp 4   (the plan's layout with tp and dp changed)
    """
    training_fields = {
        "global_batch_size": global_batch_size,
        "seq_len": seq_len,
        "dtype": dtype,
        "attention_kernel": attention,
    }
    layout_fields = {
        "data_parallel_degree": dp,
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
        "expert_parallel_degree": ep,
        "micro_batch_size": micro_batch_size,
        "zero_stage": None if zero_stage is None else ZeroStage(zero_stage),
        "recompute": recompute,
        "sequence_parallel": sequence_parallel,
        "schedule": schedule,
        "virtual_stages": virtual_stages,
        "layer_split": _parse_split(layer_split),
    }
    inputs = _resolve(plan, model, cluster, training_fields, layout_fields)
    est = api.estimate(inputs.model, inputs.cluster, inputs.training, inputs.layout)
    if output is not None:
        api.save_plan(
            make_plan(inputs.model, inputs.training, inputs.cluster, inputs.cluster_spec, inputs.layout, est), output
        )
    if output_format is OutputFormat.JSON:
        typer.echo(json.dumps(est.to_json_dict(), indent=2))
    else:
        Console().print(estimate_view(est, inputs.model, inputs.training, inputs.cluster, inputs.layout))


@app.command()
def search(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DTypeOpt = DType.BF16,
    attention: AttentionOpt = AttentionKernel.FLASH,
    top_k: Annotated[int, typer.Option(min=1, help="Plans to show, fastest first.")] = 5,
    strategy: Annotated[StrategyName, typer.Option(help="exhaustive (exact) or optuna (sampled).")] = (
        StrategyName.EXHAUSTIVE
    ),
    trials: Annotated[int | None, typer.Option(min=1, help="Layouts to evaluate at most [optuna: 400].")] = None,
    time_limit: Annotated[float | None, typer.Option(min=0.1, help="Seconds to search at most.")] = None,
    storage: Annotated[
        str, typer.Option(help="Optuna study storage; a search on the same inputs resumes it.")
    ] = "sqlite:///planner-search.db",
    memory_margin: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of device memory kept free.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the sampler and solver.")] = 0,
    output: Annotated[Path | None, typer.Option(help="Write the best plan here (plan.json).")] = None,
    verify: Annotated[
        bool, typer.Option(help="Dry-run the best plan's first and last pipeline stage beside the estimate.")
    ] = False,
) -> None:
    """Find the fastest layouts that fit in memory, and write the best as a plan file.

    Example: planner search -m gpt3-175b -c dgx-a100-80g:128 --global-batch-size 1536 --seq-len 2048
    --output plan.json
    """
    model, cluster, training = _search_inputs(model, cluster, global_batch_size, seq_len, dtype, attention)
    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("searching", total=None)
        outcome, plans = api.search_outcome(
            str(model),
            str(cluster),
            training,
            strategy=strategy,
            top_k=top_k,
            seed=seed,
            budget=Budget(max_trials=trials, max_time_s=time_limit),
            memory_margin=memory_margin,
            storage=storage if strategy is StrategyName.OPTUNA else None,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    Console().print(ranked_table(outcome, plans))
    if output is not None:
        api.save_plan(plans[0], output)
        typer.echo(f"wrote the best plan to {output}")
    if verify:
        _verify(plans[0])


@app.command()
def explain(plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")]) -> None:
    """Show a plan's memory and time breakdowns, and why it beat the runner-up.

    Example: planner explain plan.json
    """
    loaded = api.load_plan(plan)
    cluster = api.load_cluster(loaded.cluster.spec)
    console = Console()
    console.print(estimate_view(loaded.estimate, loaded.model, loaded.training, cluster, loaded.layout))
    console.print(comparison_view(loaded))


@app.command()
def launch(
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    master_addr: Annotated[str, typer.Option(help="Address of node 0, reachable from every node.")] = "MASTER_ADDR",
    master_port: Annotated[int, typer.Option(min=1, max=65535, help="Rendezvous port on node 0.")] = 29500,
    steps: Annotated[int, typer.Option(min=1, help="Training steps to run.")] = 10,
    report: Annotated[str, typer.Option(help="Where each run writes its report.")] = "report.json",
    output: Annotated[Path | None, typer.Option(help="Write a launch script (bash launch.sh NODE_RANK).")] = None,
) -> None:
    """Print the torchrun command line of every node that runs the plan.

    Example: planner launch plan.json --master-addr 10.0.0.1 --output launch.sh
    """
    commands = torchrun_commands(
        api.load_plan(plan),
        str(plan),
        master_addr=master_addr,
        master_port=master_port,
        steps=steps,
        report_path=report,
    )
    if output is not None:
        output.write_text(launch_script(commands))
        typer.echo(f"wrote {output}: run `bash {output} NODE_RANK` on each of the {len(commands)} nodes")
        return
    for cmd in commands:
        typer.echo(f"{cmd.comment()}\n{cmd.shell()}")


def _parse_delay(text: str | None) -> tuple[int, int, float] | None:
    if text is None:
        return None
    try:
        a, b, seconds = text.split(",")
        return int(a), int(b), float(seconds)
    except ValueError as e:
        raise SchemaError(f"--inject-link-delay {text!r} must be RANK_A,RANK_B,SECONDS, e.g. 0,1,0.01") from e


def _parse_fault(text: str | None) -> tuple[int, str, str] | None:
    if text is None:
        return None
    rank, phase, kind = [*text.split(","), "", "", ""][:3]
    if not rank.isdigit() or kind not in ("exit", "hang"):
        raise SchemaError(f"--inject-fault {text!r} must be RANK,PHASE,exit|hang, e.g. 2,links,exit")
    return int(rank), phase, kind


@app.command()
def profile(
    output: Annotated[Path, typer.Option(help="Where rank 0 writes the cluster profile.")] = Path("cluster.json"),
    quick: Annotated[bool, typer.Option(help="Fewer sizes and repeats: seconds instead of a minute.")] = False,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Also time this model's own GEMM shapes.")] = None,
    seq_len: Annotated[int, typer.Option(min=1, help="Sequence length of the model's shapes.")] = 512,
    dtype: Annotated[
        DType | None,
        typer.Option(
            help="Time GEMMs and the model's layers in this precision only, the one you will train in "
            "(half the time; plans in another precision are then refused) [default: fp32 and bf16]."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds a rank waits for a peer before failing.")] = 60.0,
    inject_link_delay: Annotated[str | None, typer.Option(hidden=True, help="Testing: A,B,SECONDS.")] = None,
    simulate_nodes: Annotated[int | None, typer.Option(hidden=True, min=1, help="Testing: pretend nodes.")] = None,
    inject_fault: Annotated[str | None, typer.Option(hidden=True, help="Testing: RANK,PHASE,exit|hang.")] = None,
) -> None:
    """Measure the cluster this job runs on (every link, collectives, GEMMs, memory); run under torchrun.

    Example: torchrun --nproc-per-node 4 -m planner profile --output cluster.json --quick
    """
    from profiler.run import profile as run_profile  # torch is imported only by the commands that need it
    from profiler.settings import ProfileSettings
    from profiler.settings import quick as quick_settings

    model_spec = api.load_model(model) if model else None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    settings = ProfileSettings(
        output=output,
        timeout_s=timeout,
        model=model_spec,
        model_gemm_shapes=profile_gemm_shapes(model_spec, seq_len, world_size) if model_spec else (),
        seq_len=seq_len,
        inject_link_delay=_parse_delay(inject_link_delay),
        simulate_nodes=simulate_nodes,
        inject_fault=_parse_fault(inject_fault),
    )
    if dtype is not None:
        settings = replace(settings, gemm_dtypes=(dtype,))
    code = run_profile(quick_settings(settings) if quick else settings)
    os._exit(code)  # skip interpreter teardown: gloo can abort there (field notes)


def _verify(plan: Plan) -> None:
    """Dry-run the first rank of the first and of the last pipeline stage, each in a fresh process
    (a fake process group is set up once per process)."""
    last = rank_of(plan.layout, plan.layout.pipeline_parallel_degree - 1, 0, 0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        api.save_plan(plan, path)
        for r in sorted({0, last}):
            typer.echo(f"dry run of rank {r} (fake tensors; nothing is allocated) ...", err=True)
            args = [sys.executable, "-m", "planner", "run", str(path), "--dry-run", "--rank", str(r)]
            proc = subprocess.run(args, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise PlannerError(f"the dry run of rank {r} failed: {proc.stderr.strip().splitlines()[-1]}")
            typer.echo(proc.stdout.rstrip())


def _print_dry_run(plan: Plan, ranks: list[int], optimizer: str) -> None:
    from runtime.dry_run import dry_run

    table = Table(title="dry run: traced peak memory beside the estimate (MiB = 2^20 bytes)")
    for name in ("rank", "stage", "traced MiB", "estimated MiB", "estimate / traced", "seconds"):
        table.add_column(name, justify="right")
    for r in ranks:
        result = dry_run(plan, r, optimizer=optimizer)
        table.add_row(
            str(r),
            str(result.stage),
            f"{result.peak_bytes / 2**20:,.1f}",
            f"{result.predicted_bytes / 2**20:,.1f}",
            f"{result.predicted_bytes / max(result.peak_bytes, 1):.2f}",
            f"{result.seconds:.1f}",
        )
    Console().print(table)


class OptimizerName(StrEnum):
    """Optimizers the runtime offers."""

    ADAMW = "adamw"
    SGD = "sgd"


@app.command()
def run(
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 10,
    report: Annotated[Path, typer.Option(help="Where rank 0 writes the run report.")] = Path("report.json"),
    warmup_steps: Annotated[int, typer.Option(min=0, help="First steps left out of the measured step time.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation and the synthetic data.")] = 0,
    optimizer: Annotated[OptimizerName, typer.Option(help="adamw, or sgd for exact parity checks.")] = (
        OptimizerName.ADAMW
    ),
    lr: Annotated[float, typer.Option(min=0.0, help="Learning rate.")] = 1e-3,
    data: Annotated[Path | None, typer.Option(help="A token file (uint16); default: synthetic tokens.")] = None,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds a rank waits for a peer.")] = 300.0,
    dry_run: Annotated[
        bool, typer.Option(help="Trace one rank's step with fake tensors and a fake process group (no torchrun).")
    ] = False,
    rank: Annotated[int, typer.Option(min=0, help="The rank a dry run traces.")] = 0,
) -> None:
    """Train with a plan for a few steps under torchrun; report measured beside predicted.

    With --dry-run, no devices are needed: the runtime is built for one rank of the plan's world
    under fake tensors and its peak memory is traced, to check a plan before renting its cluster.
    Example: planner run plan.json --dry-run --rank 0

    Example: torchrun --standalone --nproc-per-node 4 -m planner run plan.json --steps 10 --report report.json
    (`planner launch plan.json` prints the command for every node)
    """
    if dry_run:
        _print_dry_run(api.load_plan(plan), [rank], str(optimizer))
        return
    if "RANK" not in os.environ:
        raise SchemaError(f"planner run runs on every rank under torchrun: `planner launch {plan}` prints the command")
    from runtime.run import RunSettings
    from runtime.run import run as run_plan

    settings = RunSettings(
        plan_path=plan,
        report_path=report,
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        optimizer=str(optimizer),
        lr=lr,
        data=data,
        timeout_s=timeout,
    )
    code = run_plan(settings, api.load_plan(plan))
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: gloo can abort there (field notes)


@app.command()
def tune(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DTypeOpt = DType.BF16,
    attention: AttentionOpt = AttentionKernel.FLASH,
    top_k: Annotated[int, typer.Option(min=1, help="Plans to run.")] = 10,
    select: Annotated[
        Selection,
        typer.Option(
            help="top: the k fastest predicted. spread: k evenly spaced over the 5k fastest (the fastest "
            "included), a wider range to calibrate on and to judge the model's ranking by."
        ),
    ] = Selection.TOP,
    steps: Annotated[
        int, typer.Option(min=3, help="Training steps per plan: a warm-up, a memory-tracked step, then timed ones.")
    ] = 10,
    storage: Annotated[
        str, typer.Option(help="Optuna storage of the trials; a tune with the same inputs resumes it.")
    ] = "sqlite:///tune.db",
    study: Annotated[
        str | None, typer.Option(help="Study name [default: one per model, training and measured cluster].")
    ] = None,
    launcher: Annotated[
        str | None,
        typer.Option(
            help="Shell template that starts a plan's job on a cluster, with {run_args} (and {plan}, {report}, "
            "{steps}, {nnodes}, {nproc_per_node}, {world_size}), e.g. 'srun -N {nnodes} --ntasks-per-node 1 "
            "python -m torch.distributed.run --nnodes {nnodes} --nproc-per-node {nproc_per_node} "
            "--rdzv-backend c10d --rdzv-endpoint $(hostname):29500 {run_args}' [default: torchrun on this machine]."
        ),
    ] = None,
    trial_timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds a plan's job may take before it is stopped and failed.")
    ] = 600.0,
    workdir: Annotated[Path, typer.Option(help="Where trials keep their plans, reports and logs.")] = Path("tune"),
    calibrate: Annotated[
        bool, typer.Option(help="Store the fitted calibration in the cluster profile (see --save-calibration).")
    ] = True,
    save_calibration: Annotated[
        Path | None,
        typer.Option(help="Profile file to write, calibrated [default: the --cluster file; a preset needs this]."),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Predicted-vs-measured PNG [default: WORKDIR/validation.png].")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Write the fastest measured plan here.")] = None,
) -> None:
    """Run the search's best plans for a few steps each, keep every trial, and learn from them.

    Each plan is a trial of an Optuna study: predicted and measured step time and per-rank memory.
    A plan that runs out of memory, crashes or exceeds --trial-timeout is recorded as failed with
    its reason, and the tuner goes on. Stopped, it resumes: finished plans never run again. From
    the measured plans it fits the cluster's calibration (compute, tensor-parallel and other
    communication, per-step and per-micro-batch overheads; activation, logits and buffer memory,
    memory overhead; time and memory factors each kept only when they predict held-out plans
    better), stores it in the profile so later estimate and search use it, and shows the model's
    errors before and after (after: each plan predicted by factors fitted on the others).

    Example: planner tune -m tiny-gpt -c cluster.json --global-batch-size 32 --seq-len 128 --top-k 10
    """
    from planner.tuning.launcher import check_template
    from planner.tuning.plot import save_plot
    from planner.tuning.render import factors_table, trials_table, validation_table
    from planner.tuning.settings import TuneSettings
    from planner.tuning.tuner import tune as run_tune

    model, cluster, training = _search_inputs(model, cluster, global_batch_size, seq_len, dtype, attention)
    target = save_calibration or (Path(cluster) if Path(cluster).is_file() else None)
    if calibrate and target is None:
        raise SchemaError(
            f"--cluster {cluster} is a preset, which cannot be overwritten; give --save-calibration PATH "
            "(or --no-calibrate)"
        )
    if launcher is not None:
        check_template(launcher)
    settings = TuneSettings(
        top_k=top_k,
        select=select,
        steps=steps,
        storage=storage,
        study_name=study,
        launcher=launcher,
        trial_timeout_s=trial_timeout,
        workdir=workdir,
    )
    with Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task("running plans", total=None)
        result = run_tune(
            model,
            cluster,
            training,
            settings,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    console = Console()
    console.print(trials_table(result.records))
    typer.echo(f"study {result.study_name} in {storage}: {result.ran} plans run now, {len(result.records)} in all")
    validations = [v for v in (result.before, result.after) if v is not None]
    if validations:
        console.print(validation_table(validations))
        save_plot(validations, plot or workdir / "validation.png")
        typer.echo(f"wrote the predicted-vs-measured plot to {plot or workdir / 'validation.png'}")
    if result.calibration is not None:
        console.print(factors_table(result.calibration))
        if calibrate and target is not None:
            profile = api.load_cluster(cluster).model_copy(update={"calibration": result.calibration})
            save_cluster(profile, target)
            typer.echo(f"stored the calibration in {target}: estimate and search on it use the factors")
    best = result.best
    if best is None or best.report is None:
        raise PlannerError("no plan ran to the end; see the reasons above and the logs in " + str(workdir))
    typer.echo(f"fastest measured: {best.plan.layout.describe()}, {best.report.measured_step_time_s:.4f} s a step")
    if output is not None:
        api.save_plan(best.plan, output)
        typer.echo(f"wrote it to {output}")


@app.command()
def validate(
    storage: Annotated[str, typer.Option(help="Optuna storage of a tune's trials.")] = "sqlite:///tune.db",
    study: Annotated[str | None, typer.Option(help="Study name [default: the storage's only or newest study].")] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Profile to predict with [default: the plans' own].")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Also write the predicted-vs-measured PNG here.")] = None,
) -> None:
    """Show how right the model was on a tune's measured plans, before and after calibration.

    Example: planner validate --storage sqlite:///tune.db --plot validation.png
    """
    from planner.tuning.plot import save_plot
    from planner.tuning.render import factors_table, trials_table, validation_table
    from planner.tuning.study import records
    from planner.tuning.tuner import summarize

    sqlite_path = storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else None
    if sqlite_path is not None and not Path(sqlite_path).is_file():
        raise SchemaError(f"--storage {storage}: no such file; give the storage planner tune wrote to")
    summaries = optuna.get_all_study_summaries(storage)
    if not summaries:
        raise SchemaError(f"--storage {storage} holds no study; run planner tune first")
    names = [s.study_name for s in summaries]
    if study is not None and study not in names:
        raise SchemaError(f"--study {study!r} is not in {storage}; it holds {', '.join(names)}")
    name = study or max(summaries, key=lambda s: s.datetime_start or datetime.min).study_name
    finished = records(optuna.load_study(study_name=name, storage=storage))
    if not finished:
        raise SchemaError(f"study {name} has no finished trial yet")
    profile = api.load_cluster(cluster or finished[0].plan.cluster.spec)
    result = summarize(study_name=name, records=finished, cluster=profile, source=f"{storage} {name}")
    console = Console()
    console.print(trials_table(result.records))
    validations = [v for v in (result.before, result.after) if v is not None]
    if validations:
        console.print(validation_table(validations))
    if result.calibration is not None:
        console.print(factors_table(result.calibration))
    if plot is not None and validations:
        save_plot(validations, plot)
        typer.echo(f"wrote {plot}")


@app.command()
def presets() -> None:
    """List the model and cluster presets (use a cluster preset as NAME:NODES)."""
    typer.echo("models:   " + ", ".join(list_model_presets()))
    typer.echo("clusters: " + ", ".join(f"{name}:NODES" for name in list_cluster_presets()))


def main() -> None:
    """Console-script entry point: PlannerError exits 2 with one line; usage errors exit 2
    through typer; nothing else is caught."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        app()
    except PlannerError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
