"""Commands that plan without touching a cluster: estimate and search."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from planner import api
from planner.api import StrategyName
from planner.cli.checks import check_output, check_plot_file, check_storage, in_range
from planner.cli.layout_options import (
    DeviceMapOpt,
    ExpertPlacementOpt,
    RoutingTraceOpt,
    SecondaryPartitionSizeOpt,
    ShardingGroupSizeOpt,
    naming_layout_files,
)
from planner.cli.options import (
    RECOMPUTE_MODULES_HELP,
    AttentionOpt,
    CapacityOpt,
    ClusterOpt,
    DispatcherOpt,
    DTypeOpt,
    Fp8Bf16LayersOpt,
    Fp8ChoicesOpt,
    Fp8ExpertsOpt,
    Fp8Opt,
    Fp8ParamGatherOpt,
    GlobalBatchOpt,
    GradReduceOpt,
    IntRangeOpt,
    KernelsOpt,
    LossKernelsOpt,
    LossMethodOpt,
    ModelOpt,
    OutputFormat,
    PadOpt,
    PipelineBuffersOpt,
    PipelineFlushesOpt,
    PpOverlapOpt,
    SelectiveRecomputeOpt,
    SeqLenOpt,
    StackOpt,
    TpOverlapOpt,
    TrainDType,
    VocabularyOverlapOpt,
    constraint_fields,
    layout_fields,
    output_console,
    parse_fp8_choices,
    progress_bar,
    resolve,
    search_inputs,
    training_fields,
)
from planner.schemas import (
    ContextParallelKind,
    Plan,
    Recompute,
    Schedule,
    VocabularyLayout,
)
from planner.schemas.errors import PlannerError
from planner.schemas.geometry import rank_of
from planner.views.tables import (
    estimate_view,
    ranked_table,
)


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
    cp: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Context-parallel degree: ranks that split every sequence (ring attention: 2 cp divides "
            "--seq-len; all-to-all: cp divides it and each tp rank's query heads); the world is dp x cp x tp x pp "
            "[default: 1].",
        ),
    ] = None,
    cp_kind: Annotated[
        ContextParallelKind | None,
        typer.Option(
            help="How attention spans the cp ranks: ring (key/value blocks passed around, behind the attention) or "
            "all-to-all (DeepSpeed-Ulysses: q, k, v and the output all-to-all'd between sequence and head splits) "
            "[default: ring].",
        ),
    ] = None,
    ep: Annotated[
        int | None,
        typer.Option(min=1, help="Expert-parallel degree (MoE; divides dp, or dp x tp with --etp 1) [default: 1]."),
    ] = None,
    etp: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Expert-tensor-parallel degree (MoE with tp): tp splits every expert over the tensor-parallel "
            "group; 1 keeps experts whole and spreads them over a stage's dp x tp ranks (MoE parallel folding, "
            "Megatron-Core's --expert-tensor-parallel-size 1; needs --sequence-parallel) [default: tp].",
        ),
    ] = None,
    micro_batch_size: Annotated[int | None, typer.Option(min=1, help="Sequences per micro-batch [default: 1].")] = None,
    zero_stage: Annotated[int | None, typer.Option(min=0, max=3, help="ZeRO stage 0-3 [default: 0].")] = None,
    recompute: Annotated[Recompute | None, typer.Option(help="Activation recomputation [default: none].")] = None,
    recompute_modules: Annotated[
        str | None,
        typer.Option(help=RECOMPUTE_MODULES_HELP + "; implies --recompute selective [default: core_attn]."),
    ] = None,
    recompute_layers: Annotated[
        str | None,
        typer.Option(
            help="Layers each pipeline stage recomputes in full, its first ones (the others keep their activations; "
            "Megatron-LM's --recompute-method block), pp entries, e.g. 8,4,2,0; implies --recompute full "
            "[default: every layer]."
        ),
    ] = None,
    optimizer_offload: Annotated[
        float | None,
        typer.Option(
            callback=in_range(0.0, 1.0),
            help="Fraction of each rank's optimizer states kept in host memory and stepped by the host's CPUs "
            "(Megatron-LM's --optimizer-offload-fraction, DeepSpeed's offload_optimizer ratio), 0-1; needs "
            "--zero-stage 1-3 and a cluster that describes its hosts (the dgx presets do) [default: 0].",
        ),
    ] = None,
    parameter_offload: Annotated[
        bool | None,
        typer.Option(
            "--parameter-offload/--no-parameter-offload",
            help="ZeRO-3: keep each rank's weight and gradient shards in host memory too, beside every optimizer "
            "state (FSDP2's CPUOffloadPolicy, torchtitan's enable_cpu_offload, DeepSpeed's offload_param); implies "
            "--optimizer-offload 1; needs --zero-stage 3, dp > 1 and pp 1 [default: off].",
        ),
    ] = None,
    activation_offload: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Layers, the model's first, whose activations wait for their backward in host memory, copied "
            "down in each forward and up in each backward (Megatron-LM's --cpu-offloading-num-layers); needs pp 1, "
            "--recompute none and a cluster that describes its hosts (the dgx presets do) [default: 0].",
        ),
    ] = None,
    sequence_parallel: Annotated[
        bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Needs tp > 1 [default: off].")
    ] = None,
    schedule: Annotated[Schedule | None, typer.Option(help="Pipeline schedule [default: 1f1b].")] = None,
    virtual_stages: Annotated[
        int | None, typer.Option(min=1, help="Model chunks per pipeline rank (interleaved) [default: 1].")
    ] = None,
    layer_split: Annotated[
        str | None,
        typer.Option(
            help="Transformer layers per model chunk in pipeline order (pp x virtual stages entries), e.g. 7,9,9,7; "
            "even to spread them evenly [default: even]."
        ),
    ] = None,
    vocabulary_layout: Annotated[
        VocabularyLayout | None,
        typer.Option(
            help="Where the embedding, output layer and loss go: pinned to the first and last stage, or split by "
            "vocabulary over every pipeline rank (vocab-1, vocab-2: Vocabulary Parallelism's two algorithms; "
            "1f1b pipelines) [default: pinned]."
        ),
    ] = None,
    sharding_group_size: ShardingGroupSizeOpt = None,
    secondary_partition_size: SecondaryPartitionSizeOpt = None,
    expert_placement: ExpertPlacementOpt = None,
    device_map: DeviceMapOpt = None,
    routing_trace: RoutingTraceOpt = None,
    dtype: Annotated[
        TrainDType | None, typer.Option(help="bf16/fp16 mean mixed-precision Adam [default: bf16].")
    ] = None,
    fp8: Fp8Opt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    fp8_experts: Fp8ExpertsOpt = None,
    fp8_bf16_layers: Fp8Bf16LayersOpt = None,
    stack: StackOpt = None,
    attention: AttentionOpt = None,
    kernels: KernelsOpt = None,
    loss_kernels: LossKernelsOpt = None,
    loss_method: LossMethodOpt = None,
    selective_recompute: SelectiveRecomputeOpt = None,
    capacity_factor: CapacityOpt = None,
    pad_to_capacity: PadOpt = None,
    tp_comm_overlap: TpOverlapOpt = None,
    pp_comm_overlap: PpOverlapOpt = None,
    pipeline_flushes: PipelineFlushesOpt = None,
    pipeline_buffers: PipelineBuffersOpt = None,
    vocabulary_overlap: VocabularyOverlapOpt = None,
    grad_reduce_dtype: GradReduceOpt = None,
    moe_dispatcher: DispatcherOpt = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="table for people, json for tools.")
    ] = OutputFormat.TABLE,
    output: Annotated[Path | None, typer.Option(help="Also write the layout and its estimate as a plan file.")] = None,
) -> None:
    """Predict per-rank memory and step time of one layout.

    Example: planner estimate -m gpt3-175b -c dgx-a100-80g:128 --global-batch-size 1536 --seq-len 2048
    --dp 8 --tp 8 --pp 16 --micro-batch-size 1 --recompute full --schedule interleaved --virtual-stages 2

    Example: planner estimate --plan plan.json --tp 4 --dp 4   (the plan's layout with tp and dp changed)

    Example: planner estimate -m llama3-8b -c dgx-h100:4 --global-batch-size 256 --seq-len 4096 --dp 32
    --zero-stage 3 --sharding-group-size 16 --secondary-partition-size 8 --device-map map.json
    (every field a plan's layout holds has its option, so a searched plan can be priced field by field)
    """
    given = locals()  # every option by its parameter name (no other local is set yet)
    check_output("--output", output)
    with naming_layout_files(given):
        inputs = resolve(plan, model, cluster, training_fields(given), layout_fields(given))
        est = api.estimate(inputs.model, inputs.cluster, inputs.training, inputs.layout, routing_trace=routing_trace)
    if output is not None:
        made = api.make_plan(inputs.model, inputs.training, inputs.cluster, inputs.cluster_spec, inputs.layout, est)
        api.save_plan(made, output)
    if output_format is OutputFormat.JSON:
        typer.echo(json.dumps(est.to_json_dict(), indent=2))
    else:
        output_console().print(estimate_view(est, inputs.model, inputs.training, inputs.cluster, inputs.layout))


def search(
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DTypeOpt = TrainDType.BF16,
    fp8: Fp8ChoicesOpt = None,
    fp8_param_gather: Fp8ParamGatherOpt = None,
    fp8_experts: Fp8ExpertsOpt = None,
    fp8_bf16_layers: Fp8Bf16LayersOpt = None,
    stack: StackOpt = None,
    attention: AttentionOpt = None,
    kernels: KernelsOpt = None,
    loss_kernels: LossKernelsOpt = None,
    loss_method: LossMethodOpt = None,
    selective_recompute: SelectiveRecomputeOpt = None,
    capacity_factor: CapacityOpt = None,
    pad_to_capacity: PadOpt = None,
    tp_comm_overlap: TpOverlapOpt = None,
    pp_comm_overlap: PpOverlapOpt = None,
    pipeline_flushes: PipelineFlushesOpt = None,
    pipeline_buffers: PipelineBuffersOpt = None,
    vocabulary_overlap: VocabularyOverlapOpt = None,
    grad_reduce_dtype: GradReduceOpt = None,
    moe_dispatcher: DispatcherOpt = None,
    top_k: Annotated[int, typer.Option(min=1, help="Plans to show, fastest first.")] = 5,
    strategy: Annotated[StrategyName, typer.Option(help="exhaustive (exact) or optuna (sampled).")] = (
        StrategyName.EXHAUSTIVE
    ),
    trials: Annotated[int | None, typer.Option(min=1, help="Layouts to evaluate at most [optuna: 400].")] = None,
    time_limit: Annotated[float | None, typer.Option(callback=in_range(0.1), help="Seconds to search at most.")] = None,
    storage: Annotated[
        str, typer.Option(help="Optuna study storage; a search on the same inputs resumes it.")
    ] = "sqlite:///planner-search.db",
    memory_margin: Annotated[
        float, typer.Option(callback=in_range(0.0, 0.9), help="Share of device memory kept free (0 to 0.9).")
    ] = 0.05,
    seed: Annotated[int, typer.Option(min=0, max=2**31 - 1, help="Seed of the sampler and solver.")] = 0,
    output: Annotated[Path | None, typer.Option(help="Write the best plan here (plan.json).")] = None,
    verify: Annotated[
        bool, typer.Option(help="Dry-run the best plan's first and last pipeline stage beside the estimate.")
    ] = False,
    routing_trace: Annotated[
        Path | None,
        typer.Option(
            help="A routing trace (.npz) of the model: price each MoE layer at its busiest rank and place the "
            "experts from it (without one, routing is assumed uniform)."
        ),
    ] = None,
    vocabulary_layout: Annotated[
        list[VocabularyLayout] | None,
        typer.Option(
            help="A vocabulary layout the search may choose; repeat for several (e.g. --vocabulary-layout pinned "
            "to keep the embedding and output layer on the first and last stage, for a training framework without "
            "Vocabulary Parallelism) [default: pinned and vocab-2].",
        ),
    ] = None,
    expert_replicas: Annotated[
        int,
        typer.Option(
            help="Replica slots per expert-parallel rank and MoE layer (needs --routing-trace): the placement "
            "puts copies of the hottest experts in them and splits their tokens over the copies, as DeepSeek's "
            "EPLB redundant experts even out the ranks' load. 0 to E - E/ep (a rank hosts an expert once). Each "
            "slot costs every rank one more expert's weights, gradients and optimizer states in each of its MoE "
            "layers; the estimate counts them."
        ),
    ] = 0,
    tp: IntRangeOpt = None,
    pp: IntRangeOpt = None,
    dp: IntRangeOpt = None,
    cp: IntRangeOpt = None,
    cp_kind: Annotated[
        str | None,
        typer.Option(help="Search only these kinds of context parallelism: ring, all-to-all (a list)."),
    ] = None,
    ep: IntRangeOpt = None,
    micro_batch_size: IntRangeOpt = None,
    virtual_stages: IntRangeOpt = None,
    zero_stage: Annotated[
        str | None, typer.Option(help="Search only these ZeRO stages; 0-3 as a value, range or list (e.g. 1,3).")
    ] = None,
    schedule: Annotated[
        str | None, typer.Option(help="Search only these pipeline schedules: 1f1b, interleaved (a list).")
    ] = None,
    recompute: Annotated[
        str | None,
        typer.Option(
            help="Search only these recomputations: none, selective, full (a list). With none and full both in, "
            "a layout that does not fit without recompute also tries the fewest of each stage's first layers "
            "recomputed in full (rc-full[5,2,0,0])."
        ),
    ] = None,
    recompute_modules: Annotated[
        str | None,
        typer.Option(
            help=RECOMPUTE_MODULES_HELP + ". Selective then tries these modules alone [default: core_attn, then "
            "core_attn,mlp for a dense model or core_attn,moe for an MoE model (with mlp where it has dense layers); "
            "layernorm and moe_act, which the planner's runtime does not run, only when named]."
        ),
    ] = None,
    max_tp: Annotated[
        int | None,
        typer.Option(min=1, help="Largest tensor-parallel degree (default: one node's devices; above it spans nodes)."),
    ] = None,
    hierarchical_sharding: Annotated[
        bool,
        typer.Option(
            help="Let ZeRO shard within one node's data-parallel ranks and replicate across nodes (HSDP), and keep "
            "ZeRO-3's weights over one node after the forward (ZeRO++ hpZ), where the data-parallel group spans "
            "nodes. The planner's own runtime runs both, but not hpZ beside tensor parallelism."
        ),
    ] = True,
    optimizer_offload: Annotated[
        bool,
        typer.Option(
            "--optimizer-offload/--no-optimizer-offload",
            help="Where no layout fits, try each with the least share of its optimizer states kept in host memory "
            "and stepped by the host's CPUs that fits (Megatron-LM's --optimizer-cpu-offload, DeepSpeed's "
            "ZeRO-Offload), on a cluster that describes its hosts (the dgx presets do). A search in which some "
            "layout fits without it never offloads.",
        ),
    ] = True,
    activation_offload: Annotated[
        bool,
        typer.Option(
            "--activation-offload/--no-activation-offload",
            help="Where no layout fits, also try each without recompute or a pipeline with the fewest of its first "
            "layers' activations kept in host memory that fits (Megatron-LM's --cpu-offloading-num-layers), on a "
            "cluster that describes its hosts; the faster of it and the optimizer offload stands.",
        ),
    ] = True,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also draw every evaluated layout's predicted step time against its peak memory, the chosen plan "
            "and the usable memory, as a PNG file here (layouts that do not fit are then priced too)."
        ),
    ] = None,
) -> None:
    """Find the fastest layouts that fit in memory, and write the best as a plan file.

    --tp, --pp, --dp, --cp, --cp-kind, --ep, --micro-batch-size, --virtual-stages, --zero-stage,
    --schedule, --recompute, --recompute-modules and --max-tp narrow the search before it starts (e.g. --tp 8 --pp 1-16
    --zero-stage 1,3 --cp 1-8 --cp-kind ring); if they leave no valid layout, the error says which one did.

    Example: planner search -m gpt3-175b -c dgx-a100-80g:128 --global-batch-size 1536 --seq-len 2048
    --output plan.json
    """
    given = locals()
    check_plot_file(plot)
    recipes = parse_fp8_choices(fp8)  # each searched; the training's fields without them
    model, cluster, training = search_inputs(
        model,
        cluster,
        training_fields({**given, "fp8": None, "fp8_param_gather": None, "fp8_bf16_layers": None, "fp8_experts": None}),
    )
    constraints = constraint_fields(given)
    check_output("--output", output)
    if strategy is StrategyName.OPTUNA:
        check_storage("--storage", storage)
    settings = api.SearchSettings(
        strategy=strategy,
        budget=api.Budget(max_trials=trials, max_time_s=time_limit),
        top_k=top_k,
        seed=seed,
        memory_margin=memory_margin,
        storage=storage if strategy is StrategyName.OPTUNA else None,
        routing_trace=routing_trace,
        expert_replicas=expert_replicas,
        vocabulary_layouts=tuple(vocabulary_layout) if vocabulary_layout else None,
        hierarchical_sharding=hierarchical_sharding,
        optimizer_offload=optimizer_offload,
        activation_offload=activation_offload,
        constraints=constraints,
        record_points=plot is not None,
    )
    with progress_bar("searching", transient=True) as progress:
        outcome, plans = api.search_recipes(
            model,
            cluster,
            training,
            recipes,
            settings,
            param_gather=bool(fp8_param_gather),
            bf16_layers=fp8_bf16_layers or 0,
            experts=fp8_experts,
            progress=progress,
        )
    output_console().print(ranked_table(outcome, plans))
    if plot is not None:
        from planner.views.plots import save_search_plot  # matplotlib: only for the commands that draw

        save_search_plot(outcome.points, plans[0], outcome.usable_memory_bytes, plot, title=_search_title(plans[0]))
        typer.echo(f"wrote the search plot ({len(outcome.points)} layouts) to {plot}")
    if training.moe_capacity_factor is not None and not training.moe_pad_to_capacity:
        dropped = api.dropped_token_share(model, training, routing_trace)
        routing = "the routing trace" if routing_trace is not None else "uniform routing"
        typer.echo(
            f"capacity factor {training.moe_capacity_factor:g} drops {dropped:.1%} of the routed tokens on {routing}; "
            "the estimates do not compute them"
        )
    if output is not None:
        api.save_plan(plans[0], output)
        typer.echo(f"wrote the best plan to {output}")
    if verify:
        _verify(plans[0])


def _search_title(best: Plan) -> str:
    training = best.training
    return (
        f"{best.model.name} on {best.cluster.spec}: global batch {training.global_batch_size} x "
        f"{training.seq_len} tokens: the layouts the search priced"
    )


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
