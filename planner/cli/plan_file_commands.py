"""Commands over a plan file: explain, launch and export it; and the presets."""

import os
from pathlib import Path
from typing import Annotated

import typer

from cost_models.placement_comparison import placement_applies
from planner import api
from planner.cli.checks import check_input, check_output, check_plot_dir, in_range
from planner.cli.options import output_console
from planner.export.targets import TARGET_FILES, ExportTarget
from planner.export.torchrun import (
    MASTER_ADDR_HINT,
    NodeCommand,
    elastic_options,
    launch_script,
    run_options,
    torchrun_commands,
)
from planner.files.cluster_presets import list_cluster_presets
from planner.files.models import list_model_presets
from planner.files.plans import plan_cluster
from planner.schemas import STACKS, DeviceKind, Plan, StackName
from planner.schemas.errors import SchemaError
from planner.schemas.runtime_support import check_buildable, check_runnable
from planner.schemas.settings import RunSettings
from planner.views.tables import (
    NO_PLACEMENT,
    comparison_view,
    estimate_view,
    mapping_gain,
    mixed_devices_view,
    placement_hint,
    placement_view,
    repricing_line,
    stack_view,
    stacks_view,
    vocabulary_view,
)

PlanClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "-c",
        help="The plan's cluster profile (a file, or a preset NAME:NODES) where it is not at the path the plan "
        "names, e.g. a plan copied without its cluster.json; it must be the plan's cluster.",
    ),
]


def explain(
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    routing_trace: Annotated[
        Path | None,
        typer.Option(
            help="A routing trace (.npz) of the plan's model: compare the plan's expert placement with "
            "round-robin on it (hottest and mean rank's tokens, tokens crossing ranks and nodes)."
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also draw the plan as PNGs in this directory (created if missing): the pipeline schedule stage by "
            "stage (schedule.png), memory per stage against capacity (memory.png), the step time's terms "
            "(step_time.png)."
        ),
    ] = None,
    memory_margin: Annotated[
        float,
        typer.Option(
            callback=in_range(0.0, 0.9),
            help="With --plot: the share of device memory the search kept free (the usable line; 0 to 0.9).",
        ),
    ] = 0.05,
    cluster: PlanClusterOpt = None,
) -> None:
    """Show a plan's memory and time breakdowns, and why it beat the runner-up.

    Example: planner explain plan.json --routing-trace routing.npz

    Example: planner explain plan.json --plot plots
    """
    check_plot_dir(plot)
    shown = api.explain(plan, routing_trace=routing_trace, timeline=plot is not None, cluster=cluster)
    loaded = shown.plan
    console = output_console()
    console.print(estimate_view(loaded.estimate, loaded.model, loaded.training, shown.cluster, loaded.layout))
    console.print(comparison_view(loaded))
    if shown.mixed_devices is not None:
        mixed = shown.mixed_devices
        pricing = shown.cluster.pricing_device.name
        console.print(mixed_devices_view(loaded.estimate, mixed.stage_devices, mixed.homogeneous, pricing))
    if shown.identity_mapping is not None:
        typer.echo(mapping_gain(loaded.estimate, shown.identity_mapping))
    if shown.other_vocabulary is not None:
        other, estimate = shown.other_vocabulary
        console.print(vocabulary_view(loaded.estimate, loaded.layout, estimate, other))
    if shown.placement is not None:
        console.print(placement_view(shown.placement))
    elif routing_trace is not None:
        typer.echo(NO_PLACEMENT)
    elif placement_applies(loaded.model, loaded.layout):
        typer.echo(placement_hint(str(plan)))
    if shown.timeline is not None and plot is not None:
        from planner.views.plots import save_explain_plots  # matplotlib: only for the commands that draw

        written = save_explain_plots(loaded, shown.timeline, plot, memory_margin=memory_margin)
        typer.echo(f"wrote {', '.join(str(p) for p in written)}")


def launch(
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    master_addr: Annotated[
        str | None,
        typer.Option(
            help="Address of node 0, reachable from every node [default: each node's MASTER_ADDR, read by the lines]."
        ),
    ] = None,
    master_port: Annotated[int, typer.Option(min=1, max=65535, help="Rendezvous port on node 0.")] = 29500,
    steps: Annotated[int, typer.Option(min=1, help="Training steps to run.")] = 10,
    report: Annotated[str, typer.Option(help="Where each run writes its report.")] = "report.json",
    output: Annotated[Path | None, typer.Option(help="Write a launch script (bash launch.sh NODE_RANK).")] = None,
    run_here: Annotated[
        bool,
        typer.Option(
            "--run",
            help="Run this node's line here (torchrun in this process) instead of printing it: the plan and the "
            "run's options are checked once before any rank starts, and a rank's error ends the job with one "
            "line (exit code 2 for a user error, 1 for a crash), not torchrun's traceback.",
        ),
    ] = False,
    node_rank: Annotated[
        int | None,
        typer.Option(min=0, help="With --run on a plan of several nodes: which node this is (0 runs the rendezvous)."),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="A token file (uint16) every rank reads; default: synthetic.")
    ] = None,
    elastic: Annotated[
        str | None,
        typer.Option(
            metavar="MIN:MAX",
            help="torchrun's elastic form: run on MIN to MAX nodes of the plan's cluster, restart the workers "
            "after a failure, and re-plan for the nodes a restart has (planner run --elastic); needs "
            "--checkpoint-dir.",
        ),
    ] = None,
    max_restarts: Annotated[int, typer.Option(min=0, help="With --elastic: restarts torchrun allows.")] = 3,
    checkpoint_dir: Annotated[
        str | None, typer.Option(help="The checkpoint folder every rank writes (and --resume or --elastic read).")
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="With --checkpoint-dir: steps between checkpoints [default: 1 with --elastic, else one after "
            "the last step].",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from the newest complete checkpoint in --checkpoint-dir, to --steps.")
    ] = False,
    last_call: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --elastic: seconds the rendezvous waits for more nodes once it has MIN, so also how long a "
            "restart waits for a node that died [default: torchrun's 30].",
        ),
    ] = None,
    cluster: PlanClusterOpt = None,
) -> None:
    """Print the torchrun command line of every node that runs the plan, or run this node's (--run).

    With --elastic MIN:MAX the lines are torchrun's elastic form (c10d rendezvous, --max-restarts):
    a restart with fewer nodes re-plans for them and resumes the newest checkpoint, resharded.

    With --run the line runs here, after the checks every rank would make that need no rank (the
    plan against its profile and this runtime, --resume's checkpoint and --steps, --data); a
    rank's error then ends the job with one line, and Ctrl-C with exit code 130.

    Example: planner launch plan.json --run --steps 20

    Example: planner launch plan.json --run --node-rank 1 --master-addr 10.0.0.1

    Example: planner launch plan.json --master-addr 10.0.0.1 --output launch.sh

    Example: planner launch plan.json --elastic 2:4 --max-restarts 3 --checkpoint-dir /shared/ckpt
    """
    check_output("--output", output, "launch.sh")
    loaded, sha256 = api.read_plan(plan)
    plan_cluster(loaded, cluster, required=cluster is not None)  # the profile, where found, must be the plan's
    check_buildable(loaded.model)  # as every rank would
    check_runnable(loaded, cuda=loaded.cluster.device_kind is not DeviceKind.CPU)
    elastic_launch = elastic_options(
        elastic, max_restarts, checkpoint_dir, 1 if checkpoint_every is None else checkpoint_every, last_call
    )
    settings = run_settings(
        loaded, sha256, plan, steps=steps, report=report, data=data, checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every, resume=resume, elastic=elastic_launch is not None,
    )  # fmt: skip
    if run_here:
        check_input("--data", data)
        master_addr = master_addr or os.environ.get("MASTER_ADDR")
    commands = torchrun_commands(
        loaded,
        str(plan),
        master_addr=master_addr,
        master_port=master_port,
        steps=steps,
        report_path=report,
        elastic=elastic_launch,
        run_options=run_options(settings),
    )
    if run_here:
        _run_node(settings, commands, node_rank, output)
    elif output is not None:
        _write_script(commands, output)
    else:
        _print_lines(commands)


def run_settings(
    plan: Plan,
    sha256: str,
    plan_file: Path,
    *,
    steps: int,
    report: str,
    data: Path | None,
    checkpoint_dir: str | None,
    checkpoint_every: int | None,
    resume: bool,
    elastic: bool,
) -> RunSettings:
    """The RunSettings each rank's `planner run` gets from launch's options (its own checks refuse
    contradicting ones, e.g. --resume without --checkpoint-dir, before any line is printed or run)."""
    return RunSettings(
        plan=plan,
        plan_sha256=sha256,
        plan_file=plan_file,
        report_path=Path(report),
        steps=steps,
        data=data,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        checkpoint_every=checkpoint_every or 0,
        resume=resume,
        elastic=elastic,
    )


def _run_node(
    settings: RunSettings, commands: tuple[NodeCommand, ...], node_rank: int | None, output: Path | None
) -> None:
    """Run this node's line here (``api.launch_node``) once what needs no rank is checked; exit
    with the job's code, its lines on stderr."""
    if output is not None:
        raise SchemaError("--run runs the line here and --output writes a script to run elsewhere; give one of them")
    if len(commands) > 1 and node_rank is None and not settings.elastic:
        raise SchemaError(
            f"the plan runs on {len(commands)} nodes: give --node-rank 0..{len(commands) - 1} on each, "
            "with --master-addr the address of node 0"
        )
    node = node_rank or 0
    if node >= len(commands):
        raise SchemaError(
            f"--node-rank {node} is not a node of the plan's {len(commands)}; give 0..{len(commands) - 1}"
        )
    if commands[node].reads_master_addr:
        raise SchemaError(MASTER_ADDR_HINT)
    api.check_resumable(settings)
    api.check_devices(settings.plan)
    outcome = api.launch_node(commands[node])
    for line in outcome.lines:
        typer.echo(line, err=True)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def _write_script(commands: tuple[NodeCommand, ...], output: Path) -> None:
    """Write the launch script and say how to run it."""
    output.write_text(launch_script(commands))
    where = " with MASTER_ADDR set to the address of node 0" if any(c.reads_master_addr for c in commands) else ""
    typer.echo(f"wrote {output}: run `bash {output} NODE_RANK` on each of the {len(commands)} nodes{where}")


def _print_lines(commands: tuple[NodeCommand, ...]) -> None:
    """Print each node's line, after a hint where the lines read MASTER_ADDR from the shell."""
    if any(cmd.reads_master_addr for cmd in commands):
        typer.echo(f"# {MASTER_ADDR_HINT}; the lines read it from the shell, e.g. export MASTER_ADDR=10.0.0.1")
    for cmd in commands:
        typer.echo(f"{cmd.comment()}\n{cmd.shell()}")


def export(
    plan: Annotated[Path, typer.Argument(help="A plan file from `planner search`.")],
    to: Annotated[
        ExportTarget,
        typer.Option(help="torchtitan: a TOML job config; megatron: Megatron-LM arguments; deepspeed: a JSON config."),
    ],
    output: Annotated[Path | None, typer.Option(help="Write the export here [default: print it].")] = None,
    cluster: PlanClusterOpt = None,
) -> None:
    """Write a plan as torchtitan's, Megatron-LM's or DeepSpeed's config; a plan feature the target
    cannot express is refused in one line, never dropped.

    The config is written as the target runs the plan (its stack: `planner stacks`), and where that
    prices the plan otherwise than the stack it was searched for, the step time and peak memory
    under both are printed (on stderr when the config goes to stdout).

    Example: planner export plan.json --to torchtitan --output job.toml
    """
    check_output("--output", output, TARGET_FILES[ExportTarget(to)])
    exported = api.export_plan(plan, to, cluster=cluster)
    if output is None:
        typer.echo(exported.text, nl=False)
    else:
        output.write_text(exported.text)
        typer.echo(f"wrote {output} ({to} export of {plan})")
    if exported.note is not None:  # beside the text, never in it: Megatron-LM's arguments must paste as they are
        typer.echo(exported.note, err=True)
    if exported.planned is not None and exported.under_target is not None:
        line = repricing_line(exported.planned, exported.under_target, exported.plan_stack, exported.target_stack)
        typer.echo(line, err=output is None)
    elif exported.not_priced is not None:
        typer.echo(f"not re-priced as {exported.target_stack} runs it: {exported.not_priced}", err=True)


def stacks(
    name: Annotated[
        StackName | None, typer.Argument(help="A stack: show each of its values and where it comes from.")
    ] = None,
) -> None:
    """List the stacks a plan can be priced for (--stack on estimate, search and replan), or one stack's
    values with their sources.

    Example: planner stacks megatron-lm
    """
    console = output_console()
    console.print(stacks_view() if name is None else stack_view(STACKS[name]))


def presets() -> None:
    """List the model and cluster presets (use a cluster preset as NAME:NODES)."""
    typer.echo("models:   " + ", ".join(list_model_presets()))
    typer.echo("clusters: " + ", ".join(f"{name}:NODES" for name in list_cluster_presets()))
