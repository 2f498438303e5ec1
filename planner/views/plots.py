"""Plans as pictures: a plan's pipeline schedule, its memory per stage and its step time
(``planner explain --plot DIR``), and a search's every evaluated layout (``planner search --plot
FILE``). PNG files only; matplotlib's Figure without pyplot (no backend, no screen, no global
state), imported by the commands that draw and by nothing else, so the CLI starts quickly.
"""

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator

from cost_models.schedule_timeline import Activity, Timeline, pipeline_time_s
from planner.schemas import MemoryBreakdown, Plan
from planner.schemas.settings import DEFAULT_MEMORY_MARGIN
from planner.search_engine.evaluate import LayoutPoint

COLORS = {
    Activity.FORWARD: "#4c72b0",
    Activity.RECOMPUTE: "#dd8452",
    Activity.BACKWARD: "#55a868",
    Activity.COMMUNICATION: "#c44e52",
}
BUBBLE_COLOR = "#e8e8e8"
MEMORY_COLORS = ("#4c72b0", "#8172b3", "#dd8452", "#55a868", "#c44e52", "#937860", "#8c8c8c")
"""One per MemoryBreakdown field, in field order."""
TIME_TERMS = (
    ("compute_s", "compute", COLORS[Activity.FORWARD]),
    ("recompute_s", "recompute", COLORS[Activity.RECOMPUTE]),
    ("tensor_parallel_comm_s", "tensor-parallel comm", COLORS[Activity.COMMUNICATION]),
    ("expert_parallel_comm_s", "expert-parallel comm", COLORS[Activity.COMMUNICATION]),
    ("pipeline_comm_s", "pipeline comm", COLORS[Activity.COMMUNICATION]),
    ("pipeline_bubble_s", "pipeline bubble", "#a0a0a0"),
    ("data_parallel_comm_s", "data-parallel comm (exposed)", COLORS[Activity.COMMUNICATION]),
    ("optimizer_s", "optimizer", "#937860"),
    ("overhead_s", "calibrated overhead", "#8c8c8c"),
)
"""TimeBreakdown terms in critical-path order: field, label, colour (the schedule's where it has one)."""
DPI = 100
LABEL_MIN_SHARE = 0.012
"""A span is numbered by its micro-batch where it is at least this share of the schedule's width."""
EXPLAIN_FILES = ("schedule.png", "memory.png", "step_time.png")


def save_explain_plots(
    plan: Plan, timeline: Timeline, directory: Path, *, memory_margin: float = DEFAULT_MEMORY_MARGIN
) -> tuple[Path, ...]:
    """Write the plan's schedule, memory and step-time plots into ``directory`` (which exists).

    Args:
        plan: the plan drawn.
        timeline: its pipeline step op by op (``planner.explain(..., timeline=True)``).
        directory: where the PNGs go.
        memory_margin: the share of device memory the search kept free: the memory plot's usable
            line, which a plan's peak had to stay under.

    Returns:
        The files written, ``EXPLAIN_FILES`` in ``directory``.
    """
    paths = tuple(directory / name for name in EXPLAIN_FILES)
    figures = (_schedule(plan, timeline), _memory(plan, memory_margin), _step_time(plan, timeline))
    for fig, path in zip(figures, paths, strict=True):
        fig.savefig(path, dpi=DPI)
    return paths


def _unit(seconds: float) -> tuple[float, str]:
    """A scale and unit that show ``seconds`` as a number people read: s, ms or µs."""
    if seconds >= 1.0:
        return 1.0, "s"
    return (1e3, "ms") if seconds >= 1e-3 else (1e6, "µs")


def _number(value: float) -> str:
    """Three significant digits, without an exponent up to billions."""
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def _schedule(plan: Plan, timeline: Timeline) -> Figure:
    p = timeline.stages
    predicted_s = pipeline_time_s(plan.estimate.time)
    scale, unit = _unit(max(timeline.length_s, predicted_s))
    fig = Figure(figsize=(11, 1.2 + 0.55 * p), layout="constrained")
    ax = fig.subplots()
    ax.barh(range(p), timeline.length_s * scale, height=0.8, color=BUBBLE_COLOR)  # what no span covers: idle
    for activity, color in COLORS.items():
        spans = [s for s in timeline.spans if s.activity is activity]
        ax.barh(
            [s.stage for s in spans],
            [(s.end_s - s.start_s) * scale for s in spans],
            left=[s.start_s * scale for s in spans],
            height=0.8,
            color=color,
            edgecolor="white",
            linewidth=0.3,
        )
    labelled = False
    for s in timeline.spans:  # micro-batch numbers where they can be read
        wide = (s.end_s - s.start_s) > LABEL_MIN_SHARE * timeline.length_s
        if wide and s.activity in (Activity.FORWARD, Activity.BACKWARD) and s.micro_batch >= 0:
            middle = (s.start_s + s.end_s) / 2 * scale
            ax.text(middle, s.stage, str(s.micro_batch), ha="center", va="center", fontsize=7, color="white")
            labelled = True
    predicted = ax.axvline(
        predicted_s * scale,
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"estimate: {_number(predicted_s * scale)} {unit} (every slot at the slowest stage)",
    )
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top
    ax.set_xlabel(f"time in the step ({unit})")
    handles: list[Artist] = [Patch(color=c, label=str(a)) for a, c in COLORS.items()]
    handles += [Patch(color=BUBBLE_COLOR, label="bubble (idle)"), predicted]
    # below the axes, in the figure's own room: anchored under the axes, a one-stage figure cut it off
    fig.legend(handles=handles, loc="outside lower center", ncol=6, fontsize=8)
    layout = plan.layout
    micro = "numbered by micro-batch" if labelled else ""
    ax.set_title(f"{plan.model.name}: {layout.describe()} — {layout.schedule} schedule {micro}", fontsize=10)
    return fig


def _memory(plan: Plan, memory_margin: float) -> Figure:
    stages = plan.estimate.stages
    gib = 2**30
    fig = Figure(figsize=(max(5.0, 1.2 + 0.7 * len(stages)), 4.5), layout="constrained")
    ax = fig.subplots()
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    device_terms = [f for f in fields(MemoryBreakdown) if f.name != "host_bytes"]  # the host's is not the device's
    for field, color in zip(device_terms, MEMORY_COLORS, strict=True):
        values = [getattr(s.memory, field.name) / gib for s in stages]
        if not any(values):
            continue
        label = field.name.removesuffix("_bytes").replace("_", " ")
        ax.bar(x, values, bottom=bottom, color=color, label=label, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    capacity = plan.estimate.memory_capacity_bytes / gib
    usable = capacity * (1.0 - memory_margin)
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"device memory {capacity:.3g} GiB")
    ax.axhline(
        usable,
        color="#d62728",
        linestyle=":",
        linewidth=1.2,
        label=f"usable {usable:.3g} GiB ({memory_margin:.0%} kept free)",
    )
    ax.set_xticks(x, [str(s.stage) for s in stages])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per rank (2^30 bytes)")
    ax.set_ylim(0, max(capacity, *bottom) * 1.12)
    ax.set_title(f"memory per stage: peak {plan.estimate.peak_memory_bytes / gib:.3g} GiB", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _step_time(plan: Plan, timeline: Timeline) -> Figure:
    time = plan.estimate.time
    terms = [(label, getattr(time, name), color) for name, label, color in TIME_TERMS if getattr(time, name) > 0]
    step_s = time.step_time_s
    scale, unit = _unit(step_s)
    fig = Figure(figsize=(8, 0.9 + 0.4 * len(terms)), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(terms)))
    ax.barh(y, [v * scale for _, v, _ in terms], color=[c for _, _, c in terms], height=0.6)
    for i, (_, value, _) in enumerate(terms):
        share = value / step_s if step_s > 0 else 0.0
        ax.text(value * scale, i, f"  {_number(value * scale)} {unit} ({share:.0%})", va="center", fontsize=8)
    ax.set_yticks(y, [label for label, _, _ in terms])
    ax.set_ylim(len(terms) - 0.5, -0.5)
    ax.set_xlim(0, max(v for _, v, _ in terms) * scale * 1.35)
    ax.set_xlabel(f"seconds of the step's critical path ({unit})")
    est = plan.estimate
    ax.set_title(
        f"step time {_number(step_s * scale)} {unit}: {est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu:.1%}", fontsize=10
    )
    return fig


def save_search_plot(
    points: Sequence[LayoutPoint], chosen: Plan, usable_memory_bytes: float, path: Path, *, title: str = ""
) -> None:
    """Write every evaluated layout's predicted step time against its peak memory per rank, the
    chosen plan marked and the usable memory drawn, as a PNG at ``path``."""
    gib = 2**30
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    _scatter(ax, [p for p in points if p.fits], "o", "#4c72b0", "fits")
    _scatter(ax, [p for p in points if not p.fits], "x", "#b0b0b0", "does not fit")
    ax.scatter(
        [chosen.estimate.peak_memory_bytes / gib],
        [chosen.estimate.step_time_s],
        marker="*",
        s=220,
        color="#c44e52",
        edgecolor="black",
        zorder=3,
        label=f"chosen: {chosen.layout.describe()}",
    )
    usable = usable_memory_bytes / gib
    ax.axvline(usable, color="black", linestyle="--", linewidth=1, label=f"usable memory {usable:.3g} GiB")
    ax.set_yscale("log")
    ax.set_xscale("log")
    memories = [p.peak_memory_bytes / gib for p in points] + [usable]
    _log_ticks(ax.xaxis, min(memories), max(memories))
    _log_ticks(ax.yaxis, *ax.get_ylim())
    ax.set_xlabel("peak memory per rank (GiB, 2^30 bytes)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=DPI)


def _log_ticks(axis: Axis, lo: float, hi: float) -> None:
    """Plain numbers at 1-2-5 steps of a log axis, or denser where the data span less than ~1.5 decades."""
    subs = (1.0, 2.0, 5.0) if hi > 30 * lo else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    axis.set_major_locator(LogLocator(subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _scatter(ax: Axes, points: Sequence[LayoutPoint], marker: str, color: str, label: str) -> None:
    if points:
        ax.scatter(
            [p.peak_memory_bytes / 2**30 for p in points],
            [p.step_time_s for p in points],
            marker=marker,
            s=12,
            color=color,
            alpha=0.6,
            linewidths=1,
            label=f"{label} ({len(points)})",
        )
