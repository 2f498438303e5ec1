"""Long-context layouts: what the search chooses for llama3-8b and llama3-70b on 64 and
512 H100s at 32k, 128k and 1M tokens a sequence (16M tokens a step, as Llama 3's long-context
stage), and the published long-context runs beside the cost model's view of their settings.

Published runs (BF16 on H100 SXM 80 GB; MFU against 989 TFLOP/s):
- Meta, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4: Llama 3 405B's 128k stage on
  16,384 H100s, tp 8, cp 16, pp 16, dp 8, 16M tokens a batch (128 sequences): 380 TFLOP/s a GPU,
  38% BF16 MFU (``data/published_runs.yaml`` id 101). The paper's pipeline is interleaved with an
  unstated number of virtual stages: the estimate is shown for 1F1B and for each v.
- NVIDIA NeMo AutoModel performance summary (DGX-H100, BF16): Llama 3.1 70B at 8,192 tokens on
  64 H100s, FSDP 32 x cp 2, batch 128, micro-batch 1: 389 TFLOP/s a GPU, 39.3% MFU (id 38).
- NVIDIA NeMo's recipes state settings only, no throughput: ``llama3_8b_128k`` (64 GPUs, tp 4,
  pp 2, cp 8, 131,072 tokens, batch 512), ``llama3_70b_64k`` (128 GPUs, tp 8, pp 4, cp 4, 65,536
  tokens, batch 512) and ``llama3_70b`` (8,192 tokens, tp 4, pp 4, vp 5, cp 2, batch 512).
- Megatron-Core's context-parallel documentation (``docs/source/api-guide/context_parallel.rst``)
  reports its gains only as a figure (175B GPT, TP+CP against full recompute at TP 8): no
  numbers to set beside ours.
Where a source leaves ZeRO, micro-batch or recompute unstated, the estimate of its settings takes
ZeRO-1 (ZeRO-3 for FSDP), micro-batch 1, no recompute (full for the AutoModel row, which without it
would not fit 80 GB) and the interleaved schedule where the source names one, else 1F1B.

Run: .venv/bin/python benchmarks/long_context.py [--quick]   (--quick: 64 GPUs only)
"""

import sys
import time
from dataclasses import dataclass, replace

from cost_models.estimate import estimate
from planner import api
from planner.schemas import Estimate, Layout, ModelSpec, Recompute, RopeScaling, Schedule, TrainingSpec, ZeroStage
from planner.schemas.errors import PlannerError
from planner.schemas.settings import SearchSettings

STEP_TOKENS = 1 << 24
"""Tokens a step: 16M, Llama 3's batch in its long-context stage."""
SEQ_LENS = (32_768, 131_072, 1_048_576)
CLUSTERS = (("dgx-h100:8", 64), ("dgx-h100:64", 512))
MODELS = ("llama3-8b", "llama3-70b")


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """A published run's settings and, where stated, its measured MFU."""

    source: str
    model: str
    cluster: str
    seq_len: int
    batch: int
    layout: Layout
    mfu: float | None
    virtual_unstated: bool = False
    """The source ran an interleaved pipeline without stating its virtual stages: the estimate is
    shown for each v that fits the layers."""


def _layout(
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    *,
    virtual: int = 1,
    zero: ZeroStage = ZeroStage.OPTIMIZER,
    recompute: Recompute = Recompute.NONE,
) -> Layout:
    return Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        context_parallel_degree=cp,
        micro_batch_size=1,
        zero_stage=zero,
        sequence_parallel=tp > 1,
        schedule=Schedule.INTERLEAVED if virtual > 1 else Schedule.ONE_F_ONE_B,
        virtual_stages=virtual,
        recompute=recompute,
    )


PUBLISHED = (
    Published(
        source="Llama 3 paper, Table 4 (128k stage)",
        model="llama3-405b",
        cluster="dgx-h100:2048",
        seq_len=131_072,
        batch=128,
        layout=_layout(8, 8, 16, 16),
        mfu=0.38,
        virtual_unstated=True,
    ),
    Published(
        source="NeMo AutoModel, FSDP2 + cp 2 (ZeRO-3; recompute unstated, full assumed: without it 108 GiB)",
        model="llama3-70b",
        cluster="dgx-h100:8",
        seq_len=8_192,
        batch=128,
        layout=_layout(32, 1, 1, 2, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL),
        mfu=389 / 989,
    ),
    Published(
        source="NeMo recipe llama3_8b_128k",
        model="llama3-8b",
        cluster="dgx-h100:8",
        seq_len=131_072,
        batch=512,
        layout=_layout(1, 4, 2, 8),
        mfu=None,
    ),
    Published(
        source="NeMo recipe llama3_70b_64k",
        model="llama3-70b",
        cluster="dgx-h100:16",
        seq_len=65_536,
        batch=512,
        layout=_layout(1, 8, 4, 4),
        mfu=None,
    ),
    Published(
        source="NeMo recipe llama3_70b (8k)",
        model="llama3-70b",
        cluster="dgx-h100:4",
        seq_len=8_192,
        batch=512,
        layout=_layout(1, 4, 4, 2, virtual=5),
        mfu=None,
    ),
)


def _degrees(layout: Layout) -> str:
    return (
        f"cp{layout.context_parallel_degree} tp{layout.tensor_parallel_degree} "
        f"pp{layout.pipeline_parallel_degree} dp{layout.data_parallel_degree}"
    )


def _summary(est: Estimate) -> str:
    cp_share = est.time.context_parallel_comm_s / est.step_time_s
    return (
        f"MFU {est.mfu:5.1%}  {est.step_time_s:8.2f} s/step  {est.peak_memory_bytes / 2**30:5.1f} GiB  "
        f"cp comm exposed {cp_share:4.1%}"
    )


def stretched(name: str, seq_len: int) -> ModelSpec:
    """Preset ``name``, its rotary context stretched with YaRN from Llama 3's original 8,192
    positions when ``seq_len`` is beyond what its config allows (as the README tells a user to
    write a model file for 1M tokens); the preset itself otherwise."""
    model = api.load_model(name)
    if model.max_seq_len is None or seq_len <= model.max_seq_len:
        return model
    factor = -(-seq_len // 8192)
    scaling = RopeScaling(rope_type="yarn", factor=factor, original_max_position_embeddings=8192)
    return model.model_copy(update={"rope_scaling": scaling})


def chosen(model: str, cluster: str, seq_len: int, batch: int) -> str:
    """The search's best layout for the inputs, as one line."""
    start = time.perf_counter()
    try:
        spec = stretched(model, seq_len)
        plans = api.search(
            spec, cluster, TrainingSpec(global_batch_size=batch, seq_len=seq_len), SearchSettings(top_k=1)
        )
    except PlannerError as e:
        return f"no plan ({str(e).splitlines()[0][:90]})"
    best = plans[0]
    took = time.perf_counter() - start
    return f"{_degrees(best.layout):<22} {best.layout.describe():<48} {_summary(best.estimate)}  ({took:.1f} s search)"


def main() -> int:
    """Print the chosen layouts, then the published runs beside their estimates and our choice."""
    quick = "--quick" in sys.argv
    print(f"Chosen layouts ({STEP_TOKENS:,} tokens a step):")
    for cluster, gpus in CLUSTERS[:1] if quick else CLUSTERS:
        for model in MODELS:
            for seq_len in SEQ_LENS:
                batch = STEP_TOKENS // seq_len
                line = chosen(model, cluster, seq_len, batch)
                print(f"  {model:<10} {gpus:>4} H100 {seq_len:>9,} tokens x {batch:>3}: {line}")
    print("\nPublished long-context runs: their settings as the cost model prices them, and the search's choice:")
    for run in PUBLISHED:
        if quick and run.layout.world_size > 128:
            continue
        training = TrainingSpec(global_batch_size=run.batch, seq_len=run.seq_len)
        cluster = api.load_cluster(run.cluster)
        published = f"published MFU {run.mfu:.1%}" if run.mfu is not None else "no throughput published"
        print(f"  {run.source}: {run.model}, {run.layout.world_size} H100, {run.seq_len:,} x {run.batch}; {published}")
        model = api.load_model(run.model)
        layouts = [run.layout]
        if run.virtual_unstated:
            p = run.layout.pipeline_parallel_degree
            layouts += [
                replace(run.layout, schedule=Schedule.INTERLEAVED, virtual_stages=v)
                for v in range(2, 8)
                if p * v <= model.num_hidden_layers
            ]
        for layout in layouts:
            try:
                theirs = _summary(estimate(model, training, cluster, layout))
            except PlannerError as e:
                theirs = f"refused: {e}"
            schedule = f"{layout.schedule}" + (f" v{layout.virtual_stages}" if layout.virtual_stages > 1 else "")
            print(f"    their settings  {_degrees(layout):<22} {schedule:<16} {theirs}")
        print(f"    search's choice {chosen(run.model, run.cluster, run.seq_len, run.batch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
