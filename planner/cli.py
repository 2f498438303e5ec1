"""The ``planner`` command line: a thin layer over ``planner.api``.

A PlannerError (bad input, infeasible layout) prints one line and exits with code 2; any other
exception is a bug and keeps its traceback.
"""

import json
import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console

from planner import api
from planner.errors import PlannerError, SchemaError
from planner.inputs import list_cluster_presets, list_model_presets
from planner.render import estimate_view
from planner.schemas import AttentionKernel, DType, Layout, Recompute, Schedule, TrainingSpec, ZeroStage

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
    str,
    typer.Option("--model", "-m", help="Preset name (see `planner presets`) or a config.json / YAML file."),
]
ClusterOpt = Annotated[
    str,
    typer.Option("--cluster", "-c", help="Preset NAME:NODES (e.g. dgx-a100-80g:16) or a cluster profile JSON."),
]


def _parse_split(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as e:
        raise SchemaError(f"--layer-split {text!r} must be comma-separated whole numbers, e.g. 7,9,9,7") from e


@app.command()
def estimate(
    model: ModelOpt,
    cluster: ClusterOpt,
    global_batch_size: Annotated[int, typer.Option(min=1, help="Sequences per optimizer step.")],
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")],
    dp: Annotated[int, typer.Option(min=1, help="Data-parallel degree.")] = 1,
    tp: Annotated[int, typer.Option(min=1, help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option(min=1, help="Pipeline-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option(min=1, help="Expert-parallel degree (MoE; divides dp).")] = 1,
    micro_batch_size: Annotated[int, typer.Option(min=1, help="Sequences per micro-batch.")] = 1,
    zero_stage: Annotated[int, typer.Option(min=0, max=3, help="ZeRO stage 0-3.")] = 0,
    recompute: Annotated[Recompute, typer.Option(help="Activation recomputation.")] = Recompute.NONE,
    sequence_parallel: Annotated[bool, typer.Option(help="Sequence parallel (needs tp > 1).")] = False,
    schedule: Annotated[Schedule, typer.Option(help="Pipeline schedule.")] = Schedule.ONE_F_ONE_B,
    virtual_stages: Annotated[int, typer.Option(min=1, help="Model chunks per pipeline rank (interleaved).")] = 1,
    layer_split: Annotated[str | None, typer.Option(help="Layers per model chunk, e.g. 7,9,9,7.")] = None,
    dtype: Annotated[DType, typer.Option(help="Training precision (bf16/fp16: mixed precision Adam).")] = DType.BF16,
    attention: Annotated[AttentionKernel, typer.Option(help="Attention kernel.")] = AttentionKernel.FLASH,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table for people, json for tools.")
    ] = OutputFormat.TABLE,
) -> None:
    """Predict per-rank memory and step time of one layout.

    Example: planner estimate -m gpt3-175b -c dgx-a100-80g:128 --global-batch-size 1536 --seq-len 2048
    --dp 8 --tp 8 --pp 16 --micro-batch-size 1 --recompute full --schedule interleaved --virtual-stages 2
    """
    training = TrainingSpec(
        global_batch_size=global_batch_size, seq_len=seq_len, dtype=dtype, attention_kernel=attention
    )
    layout = Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        expert_parallel_degree=ep,
        micro_batch_size=micro_batch_size,
        zero_stage=ZeroStage(zero_stage),
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        schedule=schedule,
        virtual_stages=virtual_stages,
        layer_split=_parse_split(layer_split),
    )
    model_spec, cluster_profile = api.load_model(model), api.load_cluster(cluster)
    est = api.estimate(model_spec, cluster_profile, training, layout)
    if output_format is OutputFormat.JSON:
        typer.echo(json.dumps(est.to_json_dict(), indent=2))
    else:
        Console().print(estimate_view(est, model_spec, training, cluster_profile, layout))


@app.command()
def presets() -> None:
    """List the model and cluster presets (use a cluster preset as NAME:NODES)."""
    typer.echo("models:   " + ", ".join(list_model_presets()))
    typer.echo("clusters: " + ", ".join(f"{name}:NODES" for name in list_cluster_presets()))


def main() -> None:
    """Console-script entry point: PlannerError exits 2 with one line; usage errors exit 2
    through typer; nothing else is caught."""
    try:
        app()
    except PlannerError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
