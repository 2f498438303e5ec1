"""Human-readable views of the planner's results, as rich renderables (the CLI prints them)."""

from dataclasses import fields

from rich.console import Group
from rich.table import Table

from planner.schemas import ClusterProfile, Estimate, Layout, ModelSpec, TrainingSpec

GIB = 2**30


def gib(nbytes: float) -> str:
    """Bytes as GiB (2^30 bytes) with two decimals."""
    return f"{nbytes / GIB:,.2f}"


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
        "TFLOP/s per rank (hardware)",
        f"{est.hardware_flops_per_step / est.step_time_s / layout.world_size / 1e12:.1f}",
    )
    fit = "fits" if est.fits else "DOES NOT FIT"
    summary.add_row(
        "peak memory per rank",
        f"{gib(est.peak_memory_bytes)} of {gib(est.memory_capacity_bytes)} GiB ({fit})",
    )
    summary.add_row("global batch x seq len", f"{training.global_batch_size} x {training.seq_len} ({training.dtype})")

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
    for name in ["stage", "layers", *columns.values(), "total"]:
        memory.add_column(name, justify="right")
    for st in est.stages:
        mem = st.memory
        memory.add_row(
            str(st.stage),
            str(st.layers),
            *(gib(getattr(mem, f"{c}_bytes")) for c in columns),
            gib(mem.total_bytes),
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
