"""Predicted vs published throughput of the BF16 and FP8 rows of ``data/published_runs.yaml``.

Run: .venv/bin/python benchmarks/validate_h100.py
The cluster is the GPU's preset (``published_h100.CLUSTER_PRESETS``: dgx-h100 for the H100 rows,
gb200-nvl72 for the GB200 rows, in NVLink domains of the GPUs the run used); nothing is fitted to
these rows. ``published_h100`` says which rows are selected and why the others are not. The H100
rows' statistics are kept apart from the other GPUs' (``summary``).

Each row's layout keeps the degrees the source states (tp, pp, dp = GPUs / (tp pp), ep, and the
virtual stages or the schedule, micro-batch, ZeRO stage and recomputation where stated). What the
source does not state the planner chooses, as a tuned published run would: every value the search space
(``planner.search_engine.space``) allows for the free axes, with the vocabulary layers pinned
(no source splits them), priced through the search's Evaluator (memory checked with its 5%
margin), and the fastest layout that fits is the prediction. If none fits, the fastest of all is
used and the row is marked '!'.

Error = predicted / published - 1 in the source's metric. Where the row gives tokens/s/GPU,
that is B s / (step x GPUs). Where it gives only TFLOP/s per GPU, the source's FLOPs per step
(``source_flops_per_sequence``: Megatron-LM r0.8's formula for its README table, today's
causal Megatron formula for the Model Zoo, the planner's own count for the Llama 3 paper, which
states none) over the predicted step time and GPUs; the same formula both ways, so the error is
the ratio of the step times either way.

An FP8 row is priced with the recipe its source states (``published_fp8``; a row whose source
states none stays excluded), its linear GEMMs at the preset's measured FP8 GEMM rate
(``cost_models.linear_gemms``), and its statistics are kept apart from the BF16 rows' as well
as together ('overall bf16', 'overall fp8', 'overall').
"""

import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from published_h100 import CLUSTER_PRESETS, Exclusion, PublishedRun, load_runs  # the script's folder is on sys.path

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.schemas import ClusterProfile, Estimate, Layout, LinkMatrix, Schedule, TrainingSpec, VocabularyLayout
from planner.schemas.choices import Choice, RecomputeChoice
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The chosen layout's estimate for one row, and its error."""

    run: PublishedRun
    estimate: Estimate
    layout: Layout
    fits: bool
    candidates: int

    @property
    def error(self) -> float:
        """Predicted / published - 1 (the step-time ratio, published over predicted)."""
        return self.run.published_step_s / self.estimate.step_time_s - 1

    @property
    def published(self) -> float:
        """The row's metric: tokens/s/GPU if given, else TFLOP/s per GPU."""
        r = self.run
        return r.tokens_per_s_per_gpu if r.tokens_per_s_per_gpu is not None else r.tflops_per_gpu or 0.0

    @property
    def predicted(self) -> float:
        """The same metric from the predicted step time."""
        return self.published * (1 + self.error)


def training_of(run: PublishedRun) -> TrainingSpec:
    """BF16 mixed precision, with the FP8 recipe the row's source states (``published_fp8``), under
    the stack the run's source ran (``published_h100.SOURCE_STACKS``), with the behaviours its
    source or row states otherwise (``PublishedRun.behaviours``). FP8 parameter gather and the
    first and last layers some recipes keep in bf16 are not set: no row states them."""
    fp8 = {} if run.fp8_recipe is None else {"fp8": run.fp8_recipe}
    return TrainingSpec.model_validate(
        {
            "global_batch_size": run.global_batch_size,
            "seq_len": run.seq_len,
            "stack": run.stack,
            **run.behaviours,
            **fp8,
        }
    )


def pinned_axes(run: PublishedRun) -> dict[str, tuple[Choice, ...]]:
    """Values of the search axes the source states (``published_h100.Pins``)."""
    p = run.pins
    pins: dict[str, tuple[Choice, ...]] = {
        "tp": (p.tp,),
        "pp": (p.pp,),
        "dp": (p.dp,),
        "cp": (p.cp,),
        "ep": (p.ep,),
        "vocabulary": (VocabularyLayout.PINNED,),
        # every source shards over the whole data-parallel group (Megatron's distributed
        # optimizer, FSDP's FULL_SHARD / SHARD_GRAD_OP): no HSDP, no secondary partition
        "sharding_group": (None,),
        "secondary_partition": (None,),
    }
    if p.virtual_stages is not None:
        pins["virtual_stages"] = (p.virtual_stages,)
        pins["schedule"] = (Schedule.INTERLEAVED if p.virtual_stages > 1 else Schedule.ONE_F_ONE_B,)
    elif p.schedule is not None:
        pins["schedule"] = (p.schedule,)
    if p.micro_batch_size is not None:
        pins["micro_batch_size"] = (p.micro_batch_size,)
    if p.zero_stage is not None:
        pins["zero_stage"] = (p.zero_stage,)
    if p.recompute is not None:
        pins["recompute"] = (RecomputeChoice(p.recompute, p.recompute_modules),)
    return pins


def candidates(space: SearchSpace, pins: Mapping[str, Sequence[Choice]]) -> Iterator[Layout]:
    """The space's layouts with the pinned axes at their values (taken as stated, even where the
    space's own rule would not offer them, e.g. ZeRO-3 under a pipeline), the rest free; a free
    choice no layout can hold beside the pinned ones (e.g. experts not folded over tensor
    parallelism where the stated ep exceeds dp) is skipped."""

    def walk(i: int, chosen: dict[str, Choice]) -> Iterator[Layout]:
        if i == len(space.axes):
            try:
                layout = space.layout(chosen)
            except SchemaError:
                return
            yield layout
            return
        axis = space.axes[i]
        for value in pins.get(axis.name) or axis.choices(space, chosen):
            yield from walk(i + 1, {**chosen, axis.name: value})

    return walk(0, {})


def cluster_of(run: PublishedRun) -> ClusterProfile:
    """The GPU's cluster preset over the row's GPUs, one node per NVLink domain the run used: where
    that is fewer GPUs than the preset's node (64 of an NVL72 rack), the same uniform NVLink over
    fewer devices."""
    preset = load_cluster(f"{CLUSTER_PRESETS[run.gpu_type]}:{run.gpus // run.devices_per_node}")
    if preset.devices_per_node == run.devices_per_node:
        return preset
    intra = LinkMatrix(size=run.devices_per_node, uniform=preset.intra_node_links.uniform)
    fields = {"devices_per_node": run.devices_per_node, "intra_node_links": intra.model_dump()}
    return ClusterProfile.model_validate(preset.model_dump() | fields)


def predict(run: PublishedRun) -> Prediction:
    """The fastest layout that fits among the row's candidates (module docstring)."""
    model, training = run.model, training_of(run)
    cluster = cluster_of(run)
    space = SearchSpace(model=model, training=training, world_size=run.gpus, devices_per_node=run.devices_per_node)
    evaluator = Evaluator(model, training, cluster)
    best: tuple[Estimate, Layout] | None = None
    valid: list[Layout] = []
    for layout in candidates(space, pinned_axes(run)):
        try:
            est = evaluator(layout)
        except InfeasibleConfigError:
            valid.append(layout)
            continue
        if best is None or est.step_time_s < best[0].step_time_s:
            best = (est, layout)
    if best is not None:
        return Prediction(run=run, estimate=best[0], layout=best[1], fits=True, candidates=evaluator.evaluations)
    priced = []
    for layout in valid:
        try:
            priced.append((estimate(model, training, cluster, layout), layout))
        except InfeasibleConfigError:
            continue
    if not priced:
        raise InfeasibleConfigError(f"row {run.id}: no candidate layout is valid for {run.pins}")
    est, layout = min(priced, key=lambda e: e[0].step_time_s)
    return Prediction(run=run, estimate=est, layout=layout, fits=False, candidates=evaluator.evaluations)


def bottleneck(est: Estimate) -> str:
    """Compute share of the step and its two largest other terms."""
    t, step = est.time, est.step_time_s
    terms = {
        "tp": t.tensor_parallel_comm_s,
        "ep": t.expert_parallel_comm_s,
        "bubble": t.pipeline_bubble_s,
        "dp": t.data_parallel_comm_s,
        "p2p": t.pipeline_comm_s,
        "opt": t.optimizer_s,
    }
    top = sorted(terms, key=lambda k: -terms[k])[:2]
    rest = ", ".join(f"{k} {terms[k] / step:.0%}" for k in top if terms[k] > 0)
    return f"compute {(t.compute_s + t.recompute_s) / step:.0%}" + (f", {rest}" if rest else "")


def summary(predictions: Sequence[Prediction]) -> dict[str, tuple[float, float, int]]:
    """Mean absolute error, worst absolute error and row count per source and 'overall' over the
    H100 rows, the H100 BF16 and FP8 rows apart ('overall bf16', 'overall fp8'), and per other GPU
    type under its name (counted rows only: flagged rows are left out)."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for p in predictions:
        if p.run.flagged is not None:
            continue
        if p.run.gpu_type == "H100":
            by_source[p.run.source].append(abs(p.error))
            by_source["overall"].append(abs(p.error))
            by_source["overall bf16" if p.run.fp8_recipe is None else "overall fp8"].append(abs(p.error))
        else:
            by_source[p.run.gpu_type].append(abs(p.error))
    return {s: (sum(e) / len(e), max(e), len(e)) for s, e in by_source.items()}


def _row(p: Prediction) -> str:
    r = p.run
    unit = "tok/s" if r.tokens_per_s_per_gpu is not None else "TFLOP/s"
    mark = "" if p.fits else "!"
    return (
        f"{r.id:>3} {r.source:<12} {r.model.name:<16} {r.gpu_type:<5} {r.gpus:>5} {r.fp8_recipe or 'bf16':<10} "
        f"{p.layout.describe():<58} "
        f"{p.published:>8.1f} {p.predicted:>8.1f} {unit:<7} {p.error:>+7.1%}{mark}  {bottleneck(p.estimate)}, "
        f"mem {p.estimate.peak_memory_bytes / 2**30:.0f} GiB"
    )


def main() -> int:
    """Print every row, the error statistics and the excluded rows."""
    runs, excluded = load_runs()
    predictions = [predict(r) for r in runs]
    header = f"{'id':>3} {'source':<12} {'model':<16} {'GPU':<5} {'count':>5} {'precision':<10} {'layout':<58} "
    header += f"{'published':>8} {'predicted':>8}"
    print(header + "         error  bottleneck")
    for p in predictions:
        if p.run.flagged is None:
            print(_row(p))
    print("\nflagged (predicted, not in the statistics):")
    for p in predictions:
        if p.run.flagged is not None:
            print(_row(p) + f"  [{p.run.flagged}]")
    print("\nmean |error|, worst |error| (target: mean <= 8%, worst <= 15%); H100 by source, then other GPUs:")
    others = set(CLUSTER_PRESETS) - {"H100"}
    ordered = sorted(summary(predictions).items(), key=lambda kv: (kv[0] in others, kv[0].startswith("overall")))
    for source, (mean, worst, n) in ordered:
        print(f"  {source:<12} {n:>3} rows  mean {mean:6.1%}  worst {worst:6.1%}")
    flagged: dict[str, list[float]] = defaultdict(list)
    for p in predictions:
        if p.run.flagged is not None:  # by reason: "stack not described", a part no preset describes
            flagged[p.run.flagged.split(":")[0]].append(abs(p.error))
    for reason, errors in flagged.items():
        mean = sum(errors) / len(errors)
        print(f"  ({reason}) {len(errors):>3} rows  mean {mean:6.1%}  worst {max(errors):6.1%}")
    no_fit = [str(p.run.id) for p in predictions if not p.fits]
    if no_fit:
        print(f"  '!' no candidate fits the planner's memory model (fastest priced instead): rows {', '.join(no_fit)}")
    print(f"\nexcluded ({len(excluded)} of {len(runs) + len(excluded)} rows):")
    for reason, rows in _grouped(excluded).items():
        print(f"  {reason}: {', '.join(str(e.id) for e in rows)}")
    return 0


def _grouped(excluded: Sequence[Exclusion]) -> dict[str, list[Exclusion]]:
    out: dict[str, list[Exclusion]] = defaultdict(list)
    for e in excluded:
        out[e.reason].append(e)
    return out


if __name__ == "__main__":
    sys.exit(main())
