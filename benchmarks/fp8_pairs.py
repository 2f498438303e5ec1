"""Predicted vs published FP8/BF16 throughput ratios: runs of the same model, GPUs and layout
published in both precisions (references-fp8 §3).

Run: .venv/bin/python benchmarks/fp8_pairs.py

Each pair is priced twice with the layout its source states, once in bf16 and once under the FP8
recipe it ran, on the GPU's cluster preset and the source's stack (as ``validate_h100`` maps
sources to stacks); the predicted ratio is the bf16 step time over the FP8 one. Nothing is fitted
to these pairs. The acceptance (issue: FP8 and MXFP8): every ratio within 8% of the published
one and on the same side of 1.0.

Assumptions, each stated where the source is silent:
- torchtitan's H100s (96 GB HBM2e at 500 W) are priced as the dgx-h100 preset's SXM H100s; its
  2024-12 benchmark's only recipe was tensorwise (torchao's default then); its FSDP is ZeRO-3;
  the 70B table's local batch of 16 runs as one micro-batch (no pipeline, no accumulation).
- The planner prices (and its runtime and torchtitan export run) the linear layers torchao's
  auto filter converts. The async-TP table's rowwise rows (2025-06: 599.6 and 624.8 tokens/s)
  converted attention.wk and attention.wv too, which the filter keeps in bf16 for rowwise
  ("approx ~40% slowdown for those layers", torchtitan PR 1319, which added the filter); that PR
  gives the same runs with the two filtered, "~660" and "~695" tokens/s against bf16's 597 and
  652.4, and those are the pairs here. The tensorwise rows (torchtitan's tables, torchao's
  float8 training table) also converted wk and wv, which the filter keeps in bf16 for tensorwise
  only where K <= 4096 (llama3-8b): their FP8 ratio is priced without those two small GEMMs.
- torchao's float8 training table (docs/source/workflows/training.md: torchtitan, 8 GPUs, local
  batch 1, seq 8192, per-op SAC, FSDP2, compile): its H100 rowwise row predates the filter and
  is left out; its B200 rows (power limited) are priced as the dgx-b200 preset, its rowwise row
  left out for the same reason (torchtitan's llama3 configs never set the filter).
- LLM Foundry's benchmark table (PR #543) ran Composer's amp_fp8, Transformer Engine's delayed
  scaling; GA 6 where the row does not state it; the 32k-token MPT-1B row with activation
  checkpointing as the 32k-token MPT-3B row states it.
- The Model Zoo's Mixtral 8x22B ran blockwise with FP8 parameter gather; its BF16 Adam moments
  (--exp-avg-dtype bf16) are not modelled (memory only).
"""

import sys
from dataclasses import dataclass, field
from typing import Any

from published_h100 import SOURCE_STACKS, load_runs  # the script's folder is on sys.path

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, ModelSpec, Recompute, Schedule, TrainingSpec, ZeroStage

TARGET = 0.08
"""Each predicted ratio within 8% of the published one (the issue's acceptance)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    """One published pair: the same run in bf16 and under an FP8 recipe."""

    source: str
    what: str
    model: str
    cluster: str
    layout: dict[str, Any]
    global_batch_size: int
    seq_len: int
    stack: str
    recipe: str
    published_ratio: float
    fp8: dict[str, Any] = field(default_factory=dict)
    behaviours: dict[str, Any] = field(default_factory=dict)


def _fsdp(dp: int, mb: int, recompute: str, **more: Any) -> dict[str, Any]:
    return {"data_parallel_degree": dp, "micro_batch_size": mb, "zero_stage": 3, "recompute": recompute, **more}


_TP8 = {"tensor_parallel_degree": 8, "sequence_parallel": True}
_FOUNDRY = dict(SOURCE_STACKS["llm-foundry"].overrides)
PAIRS = (
    Pair(source="torchtitan", what="Table 1: FSDP8, LBS 2, SAC", model="llama3-8b", cluster="dgx-h100:1",
         layout=_fsdp(8, 2, "selective"), global_batch_size=16, seq_len=8192, stack="torchtitan",
         recipe="tensorwise", published_ratio=8532 / 6667),
    Pair(source="torchtitan", what="Table 3: FSDP128, LBS 2, SAC", model="llama3-8b", cluster="dgx-h100:16",
         layout=_fsdp(128, 2, "selective"), global_batch_size=256, seq_len=8192, stack="torchtitan",
         recipe="tensorwise", published_ratio=8380 / 6514),
    Pair(source="torchtitan", what="async-TP table: FSDP32 TP8, LBS 16, full AC", model="llama3-70b",
         cluster="dgx-h100:32", layout=_fsdp(32, 16, "full", **_TP8), global_batch_size=512, seq_len=8192,
         stack="torchtitan", recipe="tensorwise", published_ratio=809.8 / 597.3),
    Pair(source="torchtitan", what="PR 1319, wk/wv filtered: FSDP32 TP8, LBS 16", model="llama3-70b",
         cluster="dgx-h100:32", layout=_fsdp(32, 16, "full", **_TP8), global_batch_size=512, seq_len=8192,
         stack="torchtitan", recipe="rowwise", published_ratio=660 / 597),
    Pair(source="torchtitan", what="async-TP table, async TP on", model="llama3-70b", cluster="dgx-h100:32",
         layout=_fsdp(32, 16, "full", **_TP8), global_batch_size=512, seq_len=8192, stack="torchtitan",
         recipe="tensorwise", published_ratio=942.4 / 652.4, behaviours={"tp_comm_overlap": True}),
    Pair(source="torchtitan", what="PR 1319, wk/wv filtered, async TP on", model="llama3-70b",
         cluster="dgx-h100:32", layout=_fsdp(32, 16, "full", **_TP8), global_batch_size=512, seq_len=8192,
         stack="torchtitan", recipe="rowwise", published_ratio=695 / 652.4, behaviours={"tp_comm_overlap": True}),
    Pair(source="torchtitan", what="async-TP table: FSDP8 TP8, LBS 12, SAC", model="llama3-8b",
         cluster="dgx-h100:8", layout=_fsdp(8, 12, "selective", **_TP8), global_batch_size=96, seq_len=8192,
         stack="torchtitan", recipe="tensorwise", published_ratio=5078.1 / 4378),
    Pair(source="torchtitan", what="async-TP table: FSDP8 TP8, async TP on", model="llama3-8b",
         cluster="dgx-h100:8", layout=_fsdp(8, 12, "selective", **_TP8), global_batch_size=96, seq_len=8192,
         stack="torchtitan", recipe="tensorwise", published_ratio=5570.1 / 4809.4,
         behaviours={"tp_comm_overlap": True}),
    Pair(source="torchao", what="float8 training table, H100: FSDP8, LBS 1, SAC", model="llama3-8b",
         cluster="dgx-h100:1", layout=_fsdp(8, 1, "selective"), global_batch_size=8, seq_len=8192,
         stack="torchtitan", recipe="tensorwise", published_ratio=7689.5 / 6150),
    Pair(source="torchao", what="float8 training table, B200: FSDP8, LBS 1, SAC", model="llama3-8b",
         cluster="dgx-b200:1", layout=_fsdp(8, 1, "selective"), global_batch_size=8, seq_len=8192,
         stack="torchtitan", recipe="tensorwise", published_ratio=10417.0 / 8307.5),
    Pair(source="torchao", what="float8 training table, B200: mxfp8_cublas", model="llama3-8b",
         cluster="dgx-b200:1", layout=_fsdp(8, 1, "selective"), global_batch_size=8, seq_len=8192,
         stack="torchtitan", recipe="mxfp8", published_ratio=9969.0 / 8307.5),
    Pair(source="llm-foundry", what="MPT-3B, MBS 3, GA 6, seq 8k", model="mpt-3b", cluster="dgx-h100:1",
         layout=_fsdp(8, 3, "none"), global_batch_size=3 * 6 * 8, seq_len=8192, stack="llm-foundry",
         recipe="delayed", published_ratio=19146 / 16578, behaviours=_FOUNDRY),
    Pair(source="llm-foundry", what="MPT-3B, MBS 40, GA 6, seq 512", model="mpt-3b", cluster="dgx-h100:1",
         layout=_fsdp(8, 40, "none"), global_batch_size=40 * 6 * 8, seq_len=512, stack="llm-foundry",
         recipe="delayed", published_ratio=36527 / 27965, behaviours=_FOUNDRY),
    Pair(source="llm-foundry", what="MPT-3B, MBS 3, GA 6, seq 32k, AC", model="mpt-3b", cluster="dgx-h100:1",
         layout=_fsdp(8, 3, "full"), global_batch_size=3 * 6 * 8, seq_len=32768, stack="llm-foundry",
         recipe="delayed", published_ratio=5856 / 5873, behaviours=_FOUNDRY),
    Pair(source="llm-foundry", what="MPT-1B, MBS 56, seq 512", model="mpt-1b", cluster="dgx-h100:1",
         layout=_fsdp(8, 56, "none"), global_batch_size=56 * 6 * 8, seq_len=512, stack="llm-foundry",
         recipe="delayed", published_ratio=70315 / 52275, behaviours=_FOUNDRY),
    Pair(source="llm-foundry", what="MPT-1B, MBS 1, seq 32k", model="mpt-1b", cluster="dgx-h100:1",
         layout=_fsdp(8, 1, "full"), global_batch_size=1 * 6 * 8, seq_len=32768, stack="llm-foundry",
         recipe="delayed", published_ratio=12580 / 12025, behaviours=_FOUNDRY),
    Pair(source="modelzoo", what="Mixtral 8x22B, TP2 PP8 EP8 VPP7", model="mixtral-8x22b", cluster="dgx-h100:16",
         layout={"data_parallel_degree": 8, "tensor_parallel_degree": 2, "pipeline_parallel_degree": 8,
                 "expert_parallel_degree": 8, "expert_tensor_parallel_degree": 1, "sequence_parallel": True,
                 "micro_batch_size": 1, "zero_stage": 1, "schedule": "interleaved", "virtual_stages": 7},
         global_batch_size=256, seq_len=4096, stack="megatron-lm", recipe="blockwise", published_ratio=560 / 465,
         fp8={"fp8_param_gather": True}),
)  # fmt: skip
"""The pairs of references-fp8 §3 whose layout the source states."""


def _models() -> dict[str, ModelSpec]:
    """The MPT models as the validation set builds them from its rows, the Llama 3 presets, and
    Mixtral 8x22B (Mistral's config.json: the 8x7B architecture at these sizes)."""
    runs, _ = load_runs()
    models = {r.model.name: r.model for r in runs if r.model.name in ("mpt-1b", "mpt-3b")}
    models |= {name: load_model(name) for name in ("llama3-8b", "llama3-70b")}
    base = load_model("mixtral-8x7b").model_dump()
    sizes = {"hidden_size": 6144, "num_hidden_layers": 56, "num_attention_heads": 48, "intermediate_size": 16384}
    models["mixtral-8x22b"] = ModelSpec.model_validate({**base, **sizes, "name": "mixtral-8x22b", "vocab_size": 32768})
    return models


def predicted_ratio(pair: Pair, model: ModelSpec) -> float:
    """The bf16 step time over the FP8 one, the same layout on the same cluster."""
    cluster = load_cluster(pair.cluster)
    fields = {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, **pair.layout}
    fields["zero_stage"] = ZeroStage(fields["zero_stage"])
    fields["recompute"] = Recompute(fields.get("recompute", "none"))
    if "schedule" in fields:
        fields["schedule"] = Schedule(fields["schedule"])
    layout = Layout(**fields)
    common = {"global_batch_size": pair.global_batch_size, "seq_len": pair.seq_len, "stack": pair.stack}
    bf16 = TrainingSpec.model_validate({**common, **pair.behaviours})
    fp8 = TrainingSpec.model_validate({**common, **pair.behaviours, "fp8": pair.recipe, **pair.fp8})
    return estimate(model, bf16, cluster, layout).step_time_s / estimate(model, fp8, cluster, layout).step_time_s


def main() -> int:
    """Print each pair, then the share within the target; exit 1 if any misses it."""
    models = _models()
    errors = []
    print(f"{'source':<12} {'model':<14} {'recipe':<11} {'what':<44} published predicted  error  side")
    for pair in PAIRS:
        ratio = predicted_ratio(pair, models[pair.model])
        error = ratio / pair.published_ratio - 1
        side = (ratio >= 1) == (pair.published_ratio >= 1)
        errors.append((abs(error), side))
        print(
            f"{pair.source:<12} {pair.model:<14} {pair.recipe:<11} {pair.what:<44} {pair.published_ratio:9.3f} "
            f"{ratio:9.3f} {error:+6.1%}  {'same' if side else 'WRONG'}"
        )
    within = sum(e <= TARGET and side for e, side in errors)
    sources = len({p.source for p in PAIRS})
    mean = sum(e for e, _ in errors) / len(errors)
    print(
        f"\n{within} of {len(PAIRS)} pairs ({sources} sources) within {TARGET:.0%} and on the published side of 1.0; "
        f"mean |error| {mean:.1%}, worst {max(e for e, _ in errors):.1%}"
    )
    return 0 if within == len(PAIRS) else 1


if __name__ == "__main__":
    sys.exit(main())
