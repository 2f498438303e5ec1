"""Tables of a tune for people: the trials, the model's figures before and after calibration,
and the fitted factors with what each does to an estimate."""

from rich.console import Group
from rich.table import Table

from planner.schemas import Calibration
from planner.tuning.study import TrialRecord
from planner.tuning.tuner import TuneResult
from planner.tuning.validate import MIN_PLANS_FOR_RANKS, Validation

MIB = 2**20


def tune_view(result: TuneResult) -> Group:
    """A tune's trials, then the figures before and after calibration and the fitted factors,
    those there are."""
    parts: list[Table] = [trials_table(result.records)]
    if result.validations:
        parts.append(validation_table(list(result.validations)))
    if result.calibration is not None:
        parts.append(factors_table(result.calibration))
    return Group(*parts)


def trials_table(records: tuple[TrialRecord, ...]) -> Table:
    """Every trial: plan, predicted and measured step time and peak memory, or why it failed."""
    table = Table(title="trials: predicted beside measured (memory: the rank with the highest measured peak)")
    for name, justify in (
        ("#", "right"),
        ("plan", "left"),
        ("predicted s", "right"),
        ("measured s", "right"),
        ("measured / predicted", "right"),
        ("predicted MiB", "right"),
        ("measured MiB", "right"),
        ("result", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in records:
        est = r.plan.estimate
        if r.report is None:
            row = ["", "", "", f"{est.peak_memory_bytes / MIB:,.1f}", "", f"[red]failed[/]: {r.failure}"]
        else:
            worst = max(r.report.memory, key=lambda m: m.peak_bytes)
            row = [
                f"{r.report.measured_step_time_s:.4f}",
                f"{r.report.measured_step_time_s / est.step_time_s:.2f}",
                f"{worst.tensors_predicted_bytes / MIB:,.1f}",  # peak_bytes counts tensors only
                f"{worst.peak_bytes / MIB:,.1f}",
                "measured" + ("" if worst.method == "MemTracker" else f" ({worst.method})"),
            ]
        table.add_row(str(r.number), r.plan.layout.describe(), f"{est.step_time_s:.4f}", *row)
    return table


def validation_table(validations: list[Validation]) -> Table:
    """The figures of each validation side by side (planner.tuning.validate gives their meaning)."""
    table = Table(title="how right the model is (errors: |predicted - measured| / measured)")
    table.add_column("figure")
    for v in validations:
        table.add_column(f"{v.title} ({len(v.plans)} plans)", justify="right")

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    def ranked(v: Validation, value: float) -> str:
        return f"{value:.3f}" if v.ranks_meaningful else f"{value:.3f} (too few plans)"

    rows = [
        ("Spearman rank correlation of step times", [ranked(v, v.spearman) for v in validations]),
        ("top-1 regret (model's pick / measured best)", [ranked(v, v.top1_regret) for v in validations]),
        ("median step-time error", [pct(v.median_time_error) for v in validations]),
        ("worst step-time error", [pct(v.worst_time_error) for v in validations]),
        ("median per-rank memory error", [pct(v.median_memory_error) for v in validations]),
        ("worst per-rank memory error", [pct(v.worst_memory_error) for v in validations]),
    ]
    for name, values in rows:
        table.add_row(name, *values)
    if not all(v.ranks_meaningful for v in validations):
        table.caption = (
            f"rank figures on fewer than {MIN_PLANS_FOR_RANKS} plans mean nothing (no rank correlation is "
            "significant on so few): run more plans (--top-k) to judge the ordering"
        )
    return table


def factors_table(calibration: Calibration) -> Table:
    """The factors fitted on every measured plan, and what each does to an estimate."""
    memory = (
        f"{calibration.memory_samples} measured ranks"
        if calibration.memory_samples
        else "no memory: memory factors did not predict held-out plans better, left at identity"
    )
    time = (
        f"{calibration.trials} plans"
        if calibration.trials
        else "no time: time factors did not predict held-out plans better, left at identity"
    )
    table = Table(title=f"calibration fitted on {time} and {memory}")
    table.add_column("factor")
    table.add_column("value", justify="right")
    table.add_column("effect on later estimates on this profile")
    c = calibration
    table.add_row(
        "compute_scale", f"{c.compute_scale:.3f}", f"compute, recompute, bubble, optimizer x {c.compute_scale:.2f}"
    )
    table.add_row(
        "tensor_parallel_scale",
        f"{c.tensor_parallel_scale:.3f}",
        f"tensor-parallel comm x {c.tensor_parallel_scale:.2f}",
    )
    table.add_row(
        "communication_scale",
        f"{c.communication_scale:.3f}",
        f"expert/pipeline/data-parallel comm x {c.communication_scale:.2f}",
    )
    table.add_row("step_overhead_s", f"{c.step_overhead_s:.4f}", f"+{c.step_overhead_s * 1e3:.1f} ms every step")
    table.add_row(
        "micro_batch_overhead_s",
        f"{c.micro_batch_overhead_s:.4f}",
        f"+{c.micro_batch_overhead_s * 1e3:.2f} ms every micro-batch (per chunk, and per pipeline fill step)",
    )
    table.add_row(
        "activation_memory_scale",
        f"{c.activation_memory_scale:.3f}",
        f"activations x {c.activation_memory_scale:.2f}",
    )
    table.add_row("logits_memory_scale", f"{c.logits_memory_scale:.3f}", f"logits x {c.logits_memory_scale:.2f}")
    table.add_row(
        "buffer_memory_scale",
        f"{c.buffer_memory_scale:.3f}",
        f"gradient buckets and staging buffers x {c.buffer_memory_scale:.2f}",
    )
    table.add_row(
        "memory_overhead_bytes",
        f"{c.memory_overhead_bytes:,.0f}",
        f"{c.memory_overhead_bytes / MIB:+.1f} MiB on every rank",
    )
    return table
