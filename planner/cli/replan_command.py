"""`planner replan`: a plan searched again for the devices left after a failure (or more)."""

from pathlib import Path
from typing import Annotated

import typer

from planner import api
from planner.api import StrategyName
from planner.cli.checks import in_range
from planner.cli.options import progress_bar
from planner.schemas import StackName


def replan(
    plan: Annotated[Path, typer.Argument(help="The plan file that ran (from `planner search`).")],
    cluster: Annotated[
        str,
        typer.Option(
            "--cluster",
            "-c",
            help="The devices to run on now: preset NAME:NODES (e.g. dgx-h100:3) or the survivors' profile JSON.",
        ),
    ],
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(help="The old run's checkpoints: check that the newest complete one loads into the new plan."),
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Write the new plan here.")] = None,
    strategy: Annotated[StrategyName, typer.Option(help="exhaustive (exact) or optuna (sampled).")] = (
        StrategyName.EXHAUSTIVE
    ),
    time_limit: Annotated[float | None, typer.Option(callback=in_range(0.1), help="Seconds to search at most.")] = None,
    memory_margin: Annotated[
        float, typer.Option(callback=in_range(0.0, 0.9), help="Share of device memory kept free (0 to 0.9).")
    ] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the sampler and solver.")] = 0,
    stack: Annotated[
        StackName | None,
        typer.Option(help="Price the new plan for this stack (`planner stacks`) [default: the old plan's]."),
    ] = None,
) -> None:
    """Search the plan's model and training again for other devices, and say what changed.

    The global batch, sequence length and precision stay; the micro-batches are reshaped so that
    each step still takes the whole batch's gradient. Prints the layout's changes and the predicted
    step time, tokens/s and throughput lost; with --checkpoint-dir, checks the old run's checkpoint
    loads into the new plan, which then resumes it resharded: planner run NEW_PLAN --checkpoint-dir
    DIR --resume (under the command planner launch NEW_PLAN prints).

    Example: planner replan plan.json --cluster dgx-h100:3 --checkpoint-dir ckpt --output plan-3.json
    """
    search = api.SearchSettings(
        strategy=strategy,
        budget=api.Budget(max_time_s=time_limit),
        top_k=api.ReplanSettings().search.top_k,
        seed=seed,
        memory_margin=memory_margin,
    )
    with progress_bar("searching", transient=True) as progress:
        result = api.replan(
            plan,
            cluster,
            api.ReplanSettings(checkpoint_dir=checkpoint_dir, search=search, stack=stack),
            progress=progress,
        )
    for line in result.summary():
        typer.echo(line)
    if output is not None:
        api.save_plan(result.new, output)
        typer.echo(f"wrote the new plan to {output}")
