"""Commands that run on a cluster: profile and run (under torchrun), tune (jobs of plans) and
validate (a tune's stored trials)."""

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from planner import api
from planner.api import OptimizerName, Selection
from planner.cli.checks import check_folder, check_input, check_output, check_storage, in_range
from planner.cli.options import (
    AttentionOpt,
    ClusterOpt,
    DTypeOpt,
    Fp8Bf16LayersOpt,
    Fp8ExpertsOpt,
    Fp8Opt,
    Fp8ParamGatherOpt,
    GlobalBatchOpt,
    KernelsOpt,
    ModelOpt,
    SeqLenOpt,
    StackOpt,
    TrainDType,
    output_console,
    progress_bar,
    say_error,
    search_inputs,
    training_fields,
)
from planner.cli.testing_aids import parse_delay, parse_fault, parse_micro_batches, parse_step_fault
from planner.schemas import DType, OnFault, StackName
from planner.schemas.errors import MissingExtraError, PlannerError, SchemaError
from planner.schemas.fp8 import Fp8Recipe
from planner.views.tables import dry_run_table, run_summary

if TYPE_CHECKING:
    from planner.tuning.tuner import TuneResult


def profile(
    output: Annotated[Path, typer.Option(help="Where rank 0 writes the cluster profile.")] = Path("cluster.json"),
    quick: Annotated[bool, typer.Option(help="Fewer sizes and repeats: seconds instead of a minute.")] = False,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Also time this model's own GEMM shapes.")] = None,
    seq_len: Annotated[int, typer.Option(min=1, help="Sequence length of the model's shapes.")] = 512,
    dtype: Annotated[
        TrainDType | None,
        typer.Option(
            help="Time GEMMs and the model's layers in this precision only, the one you will train in "
            "(half the time; plans in another precision are then refused) [default: fp32 and bf16]."
        ),
    ] = None,
    fp8: Annotated[
        Fp8Recipe | None,
        typer.Option(
            help="Also time the GEMMs in FP8 under this recipe's scaling (torch's scaled matmul, operands "
            "quantized beforehand), for plans that train in it; CUDA GPUs with FP8 tensor cores only "
            "(Hopper, Blackwell) [default: no FP8 GEMM timed, and no FP8 plan priced on the profile]."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(callback=in_range(1.0), help="Seconds a rank waits for a peer before failing.")
    ] = 60.0,
    inject_link_delay: Annotated[str | None, typer.Option(hidden=True, help="Testing: A,B,SECONDS[;...].")] = None,
    simulate_nodes: Annotated[int | None, typer.Option(hidden=True, min=1, help="Testing: pretend nodes.")] = None,
    inject_fault: Annotated[str | None, typer.Option(hidden=True, help="Testing: RANK,PHASE,exit|hang.")] = None,
    layer_micro_batches: Annotated[
        str | None, typer.Option(hidden=True, help="Testing: time the model's layers at B[,B...] only.")
    ] = None,
    layer_repeats: Annotated[
        int | None,
        typer.Option(
            hidden=True, min=1, help="Testing: repeats of the layer, optimizer, pipeline and sharding timings."
        ),
    ] = None,
) -> None:
    """Measure the cluster this job runs on (every link, collectives, GEMMs, memory); run under torchrun.

    Example: torchrun --nproc-per-node 4 -m planner profile --output cluster.json --quick
    """
    check_output("--output", output, "cluster.json")
    settings = api.ProfileSettings(
        output=output,
        quick=quick,
        model=api.load_model(model) if model is not None else None,
        seq_len=seq_len,
        timeout_s=timeout,
        inject_link_delay=parse_delay(inject_link_delay),
        simulate_nodes=simulate_nodes,
        inject_fault=parse_fault(inject_fault),
    )
    if dtype is not None:
        settings = replace(settings, gemm_dtypes=(DType(dtype),))
    if fp8 is not None:
        settings = replace(settings, fp8=fp8)
    if (micro_batches := parse_micro_batches(layer_micro_batches)) is not None:
        settings = replace(settings, layer_micro_batches=micro_batches)
    if layer_repeats is not None:
        settings = replace(settings, layer_repeats=layer_repeats)
    code = api.profile(settings)
    _exit_now(code)


DRY_RUN_OPTIONS = frozenset({"plan", "dry_run", "rank", "optimizer"})
"""What a dry run reads; the others are a real run's (data, checkpoints, reports, faults)."""


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or from the environment), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def refuse_unused_under_dry_run(ctx: typer.Context) -> None:
    """Refuse a real run's options given with --dry-run, which would ignore them: a dry run traces
    one step of synthetic tokens for one rank, and writes no report, trace or checkpoint.

    Raises:
        SchemaError: naming the options and the fix.
    """
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name is not None and param.name not in DRY_RUN_OPTIONS and _given(ctx, param.name)
    ]
    if given:
        raise SchemaError(
            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect under --dry-run, which traces one "
            "step of one rank on synthetic tokens and writes nothing; drop "
            f"{'it' if len(given) == 1 else 'them'}, or run the plan for real (planner launch PLAN)"
        )


def run(
    ctx: typer.Context,
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 10,
    report: Annotated[Path, typer.Option(help="Where rank 0 writes the run report.")] = Path("report.json"),
    warmup_steps: Annotated[int, typer.Option(min=0, help="First steps left out of the measured step time.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation and the synthetic data.")] = 0,
    optimizer: Annotated[OptimizerName, typer.Option(help="adamw, or sgd for exact parity checks.")] = (
        OptimizerName.ADAMW
    ),
    lr: Annotated[float, typer.Option(callback=in_range(0.0), help="Learning rate.")] = 1e-3,
    data: Annotated[Path | None, typer.Option(help="A token file (uint16); default: synthetic tokens.")] = None,
    timeout: Annotated[float, typer.Option(callback=in_range(1.0), help="Seconds a rank waits for a peer.")] = 300.0,
    dry_run: Annotated[
        bool, typer.Option(help="Trace one rank's step with fake tensors and a fake process group (no torchrun).")
    ] = False,
    rank: Annotated[int, typer.Option(min=0, help="The rank a dry run traces.")] = 0,
    trace_routing: Annotated[
        Path | None, typer.Option(help="Write the experts each token was routed to (.npz; MoE models).")
    ] = None,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(
            help="Save checkpoints here: every rank its part (model, optimizer, step, random state), visible only "
            "once complete."
        ),
    ] = None,
    checkpoint_every: Annotated[
        int, typer.Option(min=0, help="Steps between checkpoints (0: one after the last step).")
    ] = 0,
    keep_last: Annotated[
        int,
        typer.Option(
            min=0,
            help="Keep the newest N complete checkpoints in --checkpoint-dir (and the one resumed from), "
            "removing older ones (0: keep all).",
        ),
    ] = 0,
    log_every: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Steps between rank 0's progress lines (step, loss, step time, tokens/s); 0: none "
            "[default: every step up to 50 steps, else every 10].",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue from the newest complete checkpoint in --checkpoint-dir, to --steps: of this plan, or of "
            "another layout of the same model and global batch (planner replan), resharded."
        ),
    ] = False,
    on_fault: Annotated[
        OnFault,
        typer.Option(
            help="When a rank is far slower than the ranks doing the same work (a straggler), or a link than "
            "the links carrying the same traffic (a slow link): warn (log it, "
            "record it in the report) or exit (also stop every rank after that step, checkpoint there if "
            "--checkpoint-dir, exit with code 4)."
        ),
    ] = OnFault.WARN,
    elastic: Annotated[
        bool,
        typer.Option(
            help="For torchrun's elastic restarts (planner launch --elastic): resume from the newest checkpoint "
            "in --checkpoint-dir if there is one, and on a world size other than the plan's, re-plan for the "
            "ranks there are (written to CHECKPOINT_DIR/plans/world-N.json) and resume resharded."
        ),
    ] = False,
    inject_fault: Annotated[
        str | None, typer.Option(hidden=True, help="Testing: RANK,STEP,exit|hang|slow[-link,PEER].")
    ] = None,
) -> None:
    """Train with a plan for a few steps under torchrun; report measured beside predicted.

    If a rank dies or hangs, every other rank stops within --timeout, names it and where it last
    was, and exits with code 3; checkpoints already complete stay intact.

    Every rank times its compute and its waits in collectives; every 3 steps the ranks compare
    them (one small all-gather), and a rank computing 60% longer than the others of its pipeline
    stage in every step of 3 windows running is named, with its host, in the log and the report
    (CPU/gloo runs). So is a slow link: a process group (tp, dp, ...) whose members all wait longer
    in its collectives than the members of the groups along the same axis do, their compute level
    with their peers', named by its two ranks and their hosts.
    With --on-fault exit every rank then stops and exits with code 4, so that an elastic launcher
    can re-plan without it.

    With --dry-run, no devices are needed: the runtime is built for one rank of the plan's world
    under fake tensors and its peak memory is traced, to check a plan before renting its cluster.
    Example: planner run plan.json --dry-run --rank 0

    Example: torchrun --standalone --nproc-per-node 4 -m planner run plan.json --steps 10 --report report.json
    (`planner launch plan.json` prints the command for every node)
    """
    if dry_run:
        refuse_unused_under_dry_run(ctx)
        output_console().print(dry_run_table([api.dry_run(plan, rank, optimizer=optimizer)]))
        return
    check_output("--report", report, "report.json")
    check_output("--trace-routing", trace_routing, "routing.npz")
    check_folder("--checkpoint-dir", checkpoint_dir)
    check_input("--data", data)
    loaded, sha256 = api.read_plan(plan)  # once: a bad plan is refused before torch is imported
    settings = api.RunSettings(
        plan=loaded,
        plan_sha256=sha256,
        plan_file=plan,
        report_path=report,
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        optimizer=optimizer,
        lr=lr,
        data=data,
        timeout_s=timeout,
        trace_routing=trace_routing,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_last=keep_last,
        log_every=log_every,
        resume=resume,
        elastic=elastic,
        on_fault=on_fault,
        inject_fault=parse_step_fault(inject_fault),
    )
    try:
        measured = api.run(settings)
    except MissingExtraError:  # no torch, so no process group: main() says it
        raise
    except PlannerError as e:  # as main() says it, but without tearing down a process group (gloo can abort)
        say_error(e)
        _exit_now(e.exit_code)
    if measured is not None:  # rank 0
        traffic: tuple[float, ...] = ()
        routing = "uniform routing"
        if measured.expert_sent_bytes_per_step:
            traffic = api.expert_traffic(loaded, trace_routing)
            routing = "the captured routing" if trace_routing is not None else "uniform routing"
        typer.echo(run_summary(measured, traffic, routing), err=True)
    _exit_now(0)


def tune(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DTypeOpt = TrainDType.BF16,
    fp8: Fp8Opt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    fp8_experts: Fp8ExpertsOpt = None,
    fp8_bf16_layers: Fp8Bf16LayersOpt = None,
    stack: StackOpt = None,
    attention: AttentionOpt = None,
    kernels: KernelsOpt = None,
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
        float,
        typer.Option(callback=in_range(1.0), help="Seconds a plan's job may take before it is stopped and failed."),
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
    model, cluster, training = search_inputs(model, cluster, training_fields(locals()))
    if training.stack is not StackName.PLANNER_RUNTIME:
        raise SchemaError(
            f"--stack {training.stack}: tune runs the plans on this planner's runtime and compares them with their "
            "estimates, so it prices them for planner-runtime; leave --stack out (search --stack plans for another "
            "framework)"
        )
    check_storage("--storage", storage)
    check_folder("--workdir", workdir)
    check_output("--save-calibration", save_calibration, "cluster.json")
    check_output("--plot", plot, "validation.png")
    check_output("--output", output)
    settings = api.TuneSettings(
        top_k=top_k,
        select=select,
        steps=steps,
        storage=storage,
        study_name=study,
        launcher=launcher,
        trial_timeout_s=trial_timeout,
        workdir=workdir,
        calibrate=calibrate,
        save_calibration=save_calibration,
    )
    with progress_bar("running plans", transient=False) as progress:
        result = api.tune(model, cluster, training, settings, progress=progress)
    typer.echo(f"study {result.study_name} in {storage}: {result.ran} plans run now, {len(result.records)} in all")
    _show_tune(result, plot or workdir / "validation.png")
    best = result.best
    if best is None or best.report is None:
        raise PlannerError("no plan ran to the end; see the reasons above and the logs in " + str(workdir))
    typer.echo(f"fastest measured: {best.plan.layout.describe()}, {best.report.measured_step_time_s:.4f} s a step")
    if output is not None:
        api.save_plan(best.plan, output)
        typer.echo(f"wrote it to {output}")


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
    check_storage("--storage", storage)
    check_output("--plot", plot, "validation.png")
    _show_tune(api.validate(storage, study, cluster), plot)


def _show_tune(result: "TuneResult", plot: Path | None) -> None:
    """A tune's trials, the model's figures before and after calibration, the fitted factors and
    where they went; the predicted-vs-measured plot written to ``plot``."""
    from planner.views.tune_plot import save_plot  # matplotlib: only for the commands that draw
    from planner.views.tune_tables import tune_view

    output_console().print(tune_view(result))
    if result.calibration_path is not None:
        typer.echo(f"stored the calibration in {result.calibration_path}: estimate and search on it use the factors")
    if plot is not None and result.validations:
        save_plot(list(result.validations), plot)
        typer.echo(f"wrote the predicted-vs-measured plot to {plot}")


def _exit_now(code: int) -> None:
    """Exit without interpreter teardown: gloo can abort there (field notes, pytorch#190489)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
