"""Human-readable views of the planner's results, as rich renderables or text (the CLI prints them)."""

import math
from collections.abc import Iterable
from dataclasses import fields
from typing import Protocol

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from cost_models.placement_comparison import PlacementComparison
from planner.schemas import (
    STACKS,
    ClusterProfile,
    DType,
    Estimate,
    Layout,
    ModelSpec,
    Plan,
    RankMemory,
    RunReport,
    Stack,
    StackName,
    TrainingSpec,
)
from planner.search_engine.runner import SearchOutcome

GIB = 2**30
MIB = 2**20


def gib(nbytes: float) -> str:
    """Bytes as GiB (2^30 bytes) with two decimals."""
    return f"{nbytes / GIB:,.2f}"


FLOP_RATE_UNITS = {0: "FLOP/s", 3: "kFLOP/s", 6: "MFLOP/s", 9: "GFLOP/s", 12: "TFLOP/s", 15: "PFLOP/s"}
"""FLOP/s prefixes by power of ten: a CPU rank does GFLOP/s, a GPU TFLOP/s, a whole cluster PFLOP/s."""


def flop_rate(flop_per_s: float) -> str:
    """``flop_per_s`` to 3 significant figures in the largest unit of ``FLOP_RATE_UNITS`` it holds
    at least one of (e.g. 12.3 GFLOP/s, 148 TFLOP/s), so a CPU rank's rate does not print as
    "0.0 TFLOP/s". Rounding comes first: 999.6e9 is "1.00 TFLOP/s", not "1.00e+03 GFLOP/s"."""
    if not math.isfinite(flop_per_s) or flop_per_s <= 0:
        return f"{flop_per_s:g} FLOP/s"
    mantissa, exponent = f"{flop_per_s:.2e}".split("e")
    power = min(max(3 * (int(exponent) // 3), 0), max(FLOP_RATE_UNITS))
    shift = int(exponent) - power
    return f"{float(mantissa) * 10**shift:.{max(2 - shift, 0)}f} {FLOP_RATE_UNITS[power]}"


def stack_label(training: TrainingSpec) -> str:
    """The training's stack and, in brackets, each behaviour it runs otherwise (e.g.
    "megatron-lm (kernels=eager)")."""
    changed = ", ".join(f"{name}={_value(name, value)}" for name, value in training.overrides.items())
    return f"{training.stack} ({changed})" if changed else str(training.stack)


NONE_MEANS = {"loss_kernels": "as kernels", "grad_reduce_dtype": "fp32 under bf16"}
"""What a behaviour's None stands for (``TrainingSpec``'s field descriptions)."""


def _value(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return NONE_MEANS.get(name, "default") if value is None else str(value)


def stacks_view() -> Table:
    """Every named stack with its one-line summary and the behaviours where it differs from planner-runtime's."""
    base = STACKS[StackName.PLANNER_RUNTIME].behaviours(DType.BF16)
    table = Table(title="stacks (planner stacks NAME: each value and its source)")
    for column in ("stack", "what it is", "runs otherwise than planner-runtime (under bf16)"):
        table.add_column(column)
    for stack in STACKS.values():
        values = stack.behaviours(DType.BF16)
        changed = ", ".join(f"{k}={_value(k, v)}" for k, v in values.items() if v != base[k])
        table.add_row(str(stack.name), stack.summary, changed or "-")
    return table


def stack_view(stack: Stack) -> Table:
    """One stack's value of each behaviour and where it comes from."""
    table = Table(title=f"{stack.name}: {stack.summary}")
    for column in ("behaviour", "value", "source"):
        table.add_column(column)
    for name, value in stack.behaviours(DType.BF16).items():
        shown = "the training precision" if name == "grad_reduce_dtype" and stack.reduce_in_training_dtype else value
        table.add_row(name, _value(name, shown), escape(stack.sources[name]))  # sources name [config] sections
    fp8 = "none" if stack.fp8_library is None else f"{stack.fp8_library}: {', '.join(stack.fp8_recipes)}"
    table.add_row("fp8", fp8, escape(stack.fp8_source))
    if stack.fp8_library is not None:
        experts = "in FP8, with the other linear layers" if stack.fp8_experts else "in the training precision"
        if stack.fp8_expert_recipes:
            experts += f"; in FP8 with --fp8-experts under {', '.join(stack.fp8_expert_recipes)}"
        table.add_row("fp8 routed experts", experts, escape(stack.fp8_experts_source))
    gradients = "on demand" if stack.gradients_on_demand else "held for the run"
    table.add_row("gradients", gradients, escape(stack.gradients_source))
    return table


def repricing_line(planned: Estimate, under_target: Estimate, plan_stack: str, target_stack: str) -> str:
    """How the target's stack changes a plan's step time and peak memory per rank, in one line
    (``flows.export.Exported``), and whether the plan still fits there."""
    time_change = under_target.step_time_s / planned.step_time_s - 1
    faster = f"{abs(time_change):.1%} {'faster' if time_change < 0 else 'slower'}"
    memory_change = under_target.peak_memory_bytes - planned.peak_memory_bytes
    memory = f"{gib(abs(memory_change))} GiB {'less' if memory_change < 0 else 'more'} a rank"
    line = (
        f"priced for {plan_stack} ({planned.step_time_s:.4g} s a step, {gib(planned.peak_memory_bytes)} GiB a rank); "
        f"as {target_stack} runs it: {under_target.step_time_s:.4g} s ({faster}), "
        f"{gib(under_target.peak_memory_bytes)} GiB ({memory})"
    )
    if not under_target.fits:
        line += (
            f"; it does not fit there ({gib(under_target.memory_capacity_bytes)} GiB a rank): "
            f"search --stack {target_stack} for a plan that does"
        )
    return line


def estimate_view(
    est: Estimate, model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout
) -> Group:
    """Summary, per-stage memory and the step-time breakdown of one estimate."""
    summary = Table(title=f"{model.name} on {cluster.name} ({cluster.world_size} ranks): {layout.describe()}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("step time", f"{est.step_time_s:.4g} s")
    summary.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    summary.add_row("model FLOPs / step", f"{est.model_flops_per_step:.4g}")
    summary.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}")
    summary.add_row(
        "FLOP/s per rank (hardware)",
        flop_rate(est.hardware_flops_per_step / est.step_time_s / layout.world_size),
    )
    fit = "fits" if est.fits else "DOES NOT FIT"
    summary.add_row(
        "peak memory per rank",
        f"{gib(est.peak_memory_bytes)} of {gib(est.memory_capacity_bytes)} GiB ({fit})",
    )
    if est.host_memory_per_node_bytes > 0:
        capacity = est.host_memory_capacity_bytes
        host_fit = "fits" if est.fits_host else "DOES NOT FIT"
        of = "" if capacity is None else f" of {gib(capacity)} GiB"
        summary.add_row("host memory per node (offloaded)", f"{gib(est.host_memory_per_node_bytes)}{of} ({host_fit})")
        offload_s = est.time.optimizer_offload_s + est.time.activation_offload_s
        parts = [
            *(["optimizer: host copies and CPU Adam"] if est.time.optimizer_offload_s > 0 else []),
            *(["activations: host copies"] if est.time.activation_offload_s > 0 else []),
        ]
        summary.add_row("offload time per step", f"{offload_s:.4g} s ({'; '.join(parts) or 'hidden'})")
    summary.add_row("global batch x seq len", f"{training.global_batch_size} x {training.seq_len} ({training.dtype})")
    summary.add_row("priced for (stack)", stack_label(training))

    memory = Table(title="memory per rank by pipeline stage (GiB = 2^30 bytes)")
    columns = {
        "weights": "weights",
        "gradients": "grads",
        "optimizer_states": "optim",
        "activations": "activ",
        "logits": "logits",
        "communication_buffers": "buffers",
        "workspace": "workspace",
    }
    host = ["host (offloaded)"] if est.host_memory_per_node_bytes > 0 else []
    for name in ["stage", "layers", *columns.values(), "total", *host]:
        memory.add_column(name, justify="right")
    recomputed = layout.recompute_layers
    for st in est.stages:
        mem = st.memory
        memory.add_row(
            str(st.stage),
            str(st.layers) if recomputed is None else f"{st.layers} ({recomputed[st.stage]} recomputed)",
            *(gib(getattr(mem, f"{c}_bytes")) for c in columns),
            gib(mem.total_bytes),
            *(gib(mem.host_bytes) for _ in host),
        )

    time = Table(title="step time breakdown (critical path)")
    time.add_column("term")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for f in fields(est.time):
        value = getattr(est.time, f.name)
        hidden = f.name == "data_parallel_comm_overlapped_s"
        share = "hidden" if hidden else f"{value / est.step_time_s:.1%}"
        time.add_row(f.name.removesuffix("_s").replace("_", " "), f"{value:.4g}", share)
    return Group(summary, memory, time)


def ranked_table(outcome: SearchOutcome, plans: tuple[Plan, ...]) -> Table:
    """The ranked plans of a search, with what the search covered."""
    covered = "whole space" if outcome.complete else "budget reached"
    if outcome.outpaced:
        covered = f"{outcome.outpaced:,} skipped as certainly slower, {covered}"
    table = Table(
        title=(
            f"{len(plans)} fastest layouts that fit ({outcome.strategy}: {outcome.evaluated:,} evaluated of "
            f"{outcome.space_size:,} candidates, {covered}, {outcome.elapsed_s:.1f} s)"
        ),
        caption=f"memory per rank against {gib(outcome.usable_memory_bytes)} GiB usable of "
        f"{gib(plans[0].estimate.memory_capacity_bytes)} GiB (GiB = 2^30 bytes)",
    )
    fp8 = any(plan.training.fp8 is not None for plan in plans)  # a search over FP8 recipes says which
    names = ("rank", "layout", "layer split", *(("fp8",) if fp8 else ()), "step s", "tokens/s", "MFU", "peak GiB")
    for name in names:
        table.add_column(name, justify="left" if name in ("layout", "layer split", "fp8") else "right")
    for i, plan in enumerate(plans, start=1):
        est, layout = plan.estimate, plan.layout
        split = ",".join(str(n) for n in layout.layer_split) if layout.layer_split else "even"
        recipe = (str(plan.training.fp8 or "none"),) if fp8 else ()
        table.add_row(
            str(i),
            layout.describe(),
            split,
            *recipe,
            f"{est.step_time_s:.3f}",
            f"{est.tokens_per_s:,.0f}",
            f"{est.mfu:.1%}",
            gib(est.peak_memory_bytes),
        )
    return table


def comparison_view(plan: Plan) -> Table:
    """Why the plan beat its runner-up: every time term and the peak memory, side by side."""
    table = Table(title="why it beat the runner-up")
    table.add_column("term")
    table.add_column("chosen", justify="right")
    table.add_column("runner-up", justify="right")
    table.add_column("difference", justify="right")
    if plan.runner_up is None:
        table.add_row("(the search kept no runner-up)", "", "", "")
        return table
    ours, theirs = plan.estimate, plan.runner_up.estimate
    table.add_row("layout", plan.layout.describe(), plan.runner_up.layout.describe(), "")
    for f in fields(ours.time):
        if f.name == "data_parallel_comm_overlapped_s":
            continue
        a, b = getattr(ours.time, f.name), getattr(theirs.time, f.name)
        table.add_row(f.name.removesuffix("_s").replace("_", " "), f"{a:.4g} s", f"{b:.4g} s", f"{a - b:+.4g} s")
    table.add_row(
        "step time",
        f"{ours.step_time_s:.4g} s",
        f"{theirs.step_time_s:.4g} s",
        f"{ours.step_time_s / theirs.step_time_s - 1:+.1%}",
    )
    table.add_row(
        "peak memory per rank",
        f"{gib(ours.peak_memory_bytes)} GiB",
        f"{gib(theirs.peak_memory_bytes)} GiB",
        f"{(ours.peak_memory_bytes - theirs.peak_memory_bytes) / 2**30:+.2f} GiB",
    )
    return table


def mapping_gain(mapped: Estimate, identity: Estimate) -> str:
    """One line: the plan's rank-to-device map against rank r on device r, by step time."""
    return (
        f"device map: step time {mapped.step_time_s:.4g} s against {identity.step_time_s:.4g} s with rank r "
        f"on device r ({1 - mapped.step_time_s / identity.step_time_s:+.1%} faster)"
    )


def mixed_devices_view(
    chosen: Estimate, device_names: tuple[str, ...], homogeneous: Estimate, slowest_name: str
) -> Table:
    """Per pipeline stage of a plan on mixed device types, the device type that runs it, its
    layers and compute per micro-batch, against the same layout with every rank priced as the
    slowest type (the homogeneous treatment), and the gain in step time."""
    table = Table(
        title="mixed devices: each stage priced on its own ranks' devices (the slowest of them where it spans several)",
        caption=f"step time {chosen.step_time_s:.4g} s against {homogeneous.step_time_s:.4g} s with every rank "
        f"priced as the {slowest_name} ({homogeneous.step_time_s / chosen.step_time_s:.3g}x); a faster stage "
        "takes more layers when the layer split follows each stage's time per layer",
    )
    for name in ("stage", "device", "layers", "ms / micro-batch", "as the slowest"):
        table.add_column(name, justify="left" if name == "device" else "right")
    for ours, theirs, device in zip(chosen.stages, homogeneous.stages, device_names, strict=True):
        table.add_row(
            str(ours.stage),
            device,
            str(ours.layers),
            f"{ours.compute_per_micro_batch_s * 1e3:.4g}",
            f"{theirs.compute_per_micro_batch_s * 1e3:.4g}",
        )
    return table


def vocabulary_view(chosen: Estimate, layout: Layout, other: Estimate, other_layout: Layout) -> Table:
    """Per pipeline stage, compute per micro-batch and peak memory under the plan's vocabulary
    layout and another (pinned against split over the pipeline), with the step time of each."""
    a, b = str(layout.vocabulary_layout), str(other_layout.vocabulary_layout)
    table = Table(
        title=f"vocabulary layers: {a} (chosen) against {b}",
        caption=f"step time {chosen.step_time_s:.4g} s against {other.step_time_s:.4g} s; peak memory per rank "
        f"{gib(chosen.peak_memory_bytes)} against {gib(other.peak_memory_bytes)} GiB",
    )
    for name in ("stage", "layers", f"ms / micro-batch {a}", b, f"GiB {a}", b):
        table.add_column(name, justify="right")
    for ours, theirs in zip(chosen.stages, other.stages, strict=True):
        table.add_row(
            str(ours.stage),
            str(ours.layers),
            f"{ours.compute_per_micro_batch_s * 1e3:.4g}",
            f"{theirs.compute_per_micro_batch_s * 1e3:.4g}",
            gib(ours.memory.total_bytes),
            gib(theirs.memory.total_bytes),
        )
    return table


def placement_view(comparison: PlacementComparison) -> Table:
    """The plan's expert placement beside round-robin on a routing trace: routed tokens summed
    over the MoE layers, and the ratio of the two."""
    c = comparison
    ours = "contiguous (default)" if c.contiguous else "placed"
    table = Table(
        title=f"expert placement on the routing trace: {c.routed_tokens:,} tokens, ep={c.expert_parallel_degree}, "
        f"{c.groups} group(s) on up to {c.nodes_per_group} node(s) each"
    )
    table.add_column("routed tokens (sum over MoE layers)")
    for name in (ours, "round-robin", f"{ours} / round-robin"):
        table.add_column(name, justify="right")
    a, b = c.placed, c.round_robin
    for name, x, y in (
        ("hottest rank", a.hottest_rank_tokens, b.hottest_rank_tokens),
        ("mean rank", a.mean_rank_tokens, b.mean_rank_tokens),
    ):
        table.add_row(name, f"{x:,.0f}", f"{y:,.0f}", _ratio(x, y))
    skew_a = _quotient(a.hottest_rank_tokens, a.mean_rank_tokens)
    skew_b = _quotient(b.hottest_rank_tokens, b.mean_rank_tokens)
    table.add_row("hottest / mean rank", _number(skew_a), _number(skew_b), _ratio(skew_a, skew_b))
    for name, x, y in (
        ("cross-rank, between consecutive layers", a.cross_rank_tokens, b.cross_rank_tokens),
        ("cross-node (the busiest group's)", a.cross_node_tokens, b.cross_node_tokens),
    ):
        table.add_row(name, f"{x:,.0f}", f"{y:,.0f}", _ratio(x, y))
    return table


def placement_hint(plan: str) -> str:
    """How to see the placement table of an MoE plan, in one line."""
    return (
        f"expert placement: `planner explain {plan} --routing-trace TRACE.npz` compares it with round-robin "
        "on a routing trace (`planner run --trace-routing` writes one)"
    )


NO_PLACEMENT = "expert placement: ep=1, every rank hosts every expert; there is no placement to compare"
"""What explain says of a routing trace for a plan that places no experts."""


def _quotient(x: float, y: float) -> float | None:
    return x / y if y else None


def _number(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ratio(x: float | None, y: float | None) -> str:
    """x / y, or "-" where it has no value (a zero round-robin figure)."""
    return "-" if x is None or y is None else _number(_quotient(x, y))


def run_summary(report: RunReport, expert_traffic: tuple[float, ...] = (), routing: str = "uniform routing") -> str:
    """A run's measured figures beside the plan's predictions, in four lines (MiB = 2^20 bytes; on
    CUDA a fifth, of the memory beyond tensors: ``_memory_lines``),
    and a fifth for expert parallelism: the bytes a rank's all-to-alls sent to other ranks per
    step, measured (mean rank) beside ``expert_traffic`` (per stage, ``api.expert_traffic``;
    ``routing`` names what it assumed); then a line per straggler and per slow link the run named."""
    lines = [
        f"{report.model} {report.layout.describe()} on {report.world_size} {report.device} ranks, {report.steps} steps",
        f"  step time   measured {report.measured_step_time_s:.4f} s   predicted {report.predicted_step_time_s:.4f} s"
        f"   ratio {report.measured_step_time_s / report.predicted_step_time_s:.2f}",
        f"  loss        first {report.losses[0]:.4f}   last {report.losses[-1]:.4f}",
    ]
    lines += _memory_lines(max(report.memory, key=lambda m: m.peak_bytes))
    if report.expert_sent_bytes_per_step and expert_traffic:
        measured = sum(report.expert_sent_bytes_per_step) / len(report.expert_sent_bytes_per_step)
        predicted = sum(expert_traffic) / len(expert_traffic)  # every stage has as many ranks
        lines.append(
            f"  all-to-all  measured {measured / MIB:.2f} MiB a step per rank   predicted {predicted / MIB:.2f} MiB"
            f"   ratio {measured / predicted:.2f} ({routing})"
        )
    lines += [
        f"  straggler   rank {s.rank} on host {s.host} since step {s.since_step}: {s.compute_s * 1e3:.1f} ms a step "
        f"outside collectives, its peers {s.peers_compute_s * 1e3:.1f} ms"
        + (" (run stopped)" if report.stopped_by_fault else "")
        for s in report.stragglers
    ]
    lines += [
        f"  slow link   ranks {' and '.join(f'{r} ({h})' for r, h in zip(link.ranks, link.hosts, strict=True))} "
        f"since step {link.since_step}: {link.wait_s * 1e3:.1f} ms a step in the collectives of its "
        f"{link.axis + ' ' if link.axis else ''}group, its siblings {link.siblings_wait_s * 1e3:.1f} ms"
        + (" (run stopped)" if report.stopped_by_fault else "")
        for link in report.slow_links
    ]
    return "\n".join(lines)


def _memory_lines(worst: RankMemory) -> list[str]:
    """The peak memory line; where the estimate holds a workspace (CUDA), tensors are compared
    with the estimate less it, and a second line splits what is not tensors: the allocator's slack
    and what the driver holds besides (context, libraries, NCCL), to set beside the workspace."""
    measured = f"  peak memory measured {worst.peak_bytes / MIB:.1f} MiB (rank {worst.rank}, {worst.method})   "
    workspace_bytes = worst.predicted_workspace_bytes
    if not workspace_bytes and worst.reserved_bytes is None:
        return [measured + f"predicted {worst.predicted_bytes / MIB:.1f} MiB"]
    tensors_bytes = worst.tensors_predicted_bytes
    lines = [
        measured + f"predicted {tensors_bytes / MIB:.1f} MiB of tensors   ratio "
        f"{worst.peak_bytes / max(tensors_bytes, 1.0):.2f}   (+ {workspace_bytes / MIB:.1f} MiB workspace: "
        f"{worst.predicted_bytes / MIB:.1f} MiB)"
    ]
    if worst.reserved_bytes is not None and worst.driver_used_bytes is not None:
        slack_bytes = worst.reserved_bytes - worst.peak_bytes
        outside_bytes = worst.driver_used_bytes - worst.reserved_bytes
        lines.append(
            f"  beyond tensors allocator slack {slack_bytes / MIB:.1f} MiB (reserved {worst.reserved_bytes / MIB:.1f})"
            f"   context, libraries, NCCL {outside_bytes / MIB:.1f} MiB (driver used "
            f"{worst.driver_used_bytes / MIB:.1f})   measured workspace {(slack_bytes + outside_bytes) / MIB:.1f} MiB"
            f"   assumed {workspace_bytes / MIB:.1f} MiB"
        )
    return lines


class TracedRank(Protocol):
    """What a dry run of one rank found (runtime.dry_run.DryRunResult; the planner does not import
    the runtime, which needs torch)."""

    @property
    def rank(self) -> int: ...
    @property
    def stage(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def predicted_bytes(self) -> float: ...
    @property
    def workspace_bytes(self) -> float: ...
    @property
    def seconds(self) -> float: ...


def dry_run_table(results: Iterable[TracedRank]) -> Table:
    """Each traced rank's peak memory beside the estimate of its stage: of what tensors hold (the
    trace's measure), then with the workspace no trace sees (what the search fits to the device)."""
    table = Table(title="dry run: traced peak memory beside the estimate (MiB = 2^20 bytes)")
    columns = ("rank", "stage", "traced MiB", "estimated MiB", "estimate / traced", "+ workspace MiB", "seconds")
    for name in columns:
        table.add_column(name, justify="right")
    for result in results:
        tensors_bytes = result.predicted_bytes - result.workspace_bytes
        table.add_row(
            str(result.rank),
            str(result.stage),
            f"{result.peak_bytes / MIB:,.1f}",
            f"{tensors_bytes / MIB:,.1f}",
            f"{tensors_bytes / max(result.peak_bytes, 1):.2f}",
            f"{result.predicted_bytes / MIB:,.1f}",
            f"{result.seconds:.1f}",
        )
    return table
