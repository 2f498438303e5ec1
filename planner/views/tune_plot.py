"""Predicted against measured, as a picture: step time and per-rank memory, before and after
calibration, on log axes with the line where prediction equals measurement."""

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no backend, no screen, no global state
from matplotlib.ticker import FuncFormatter

from planner.tuning.validate import Validation

MARKERS = ("o", "x", "s", "^")


def save_plot(validations: list[Validation], path: Path) -> None:
    """Write a PNG of every validation's plans (one marker each) to ``path``."""
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax_time, ax_mem = fig.subplots(1, 2)
    times: list[float] = []
    memory_mib: list[float] = []
    for v, marker in zip(validations, MARKERS, strict=False):
        pred = [p.predicted_step_time_s for p in v.plans]
        meas = [p.measured_step_time_s for p in v.plans]
        times += pred + meas
        label = f"{v.title} (Spearman {v.spearman:.2f}, median error {v.median_time_error:.0%})"
        ax_time.scatter(pred, meas, marker=marker, label=label)
        pairs = [(a / 2**20, b / 2**20) for p in v.plans for a, b in p.memory]
        if pairs and v.median_memory_error is not None:
            memory_mib += [x for pair in pairs for x in pair]
            label = f"{v.title} (median error {v.median_memory_error:.0%})"
            ax_mem.scatter([a for a, _ in pairs], [b for _, b in pairs], marker=marker, label=label)
    _finish(ax_time, "step time", "s", times)
    _finish(ax_mem, "peak memory per rank", "MiB", memory_mib)
    fig.savefig(path, dpi=110)


def _finish(ax: Axes, title: str, unit: str, values: list[float]) -> None:
    positive = [v for v in values if v > 0] or [1.0]
    lo, hi = min(positive) / 1.3, max(positive) * 1.3
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"predicted ({unit})")
    ax.set_ylabel(f"measured ({unit})")
    ax.set_title(title)
    ax.legend(fontsize=8)
