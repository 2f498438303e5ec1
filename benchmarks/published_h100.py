"""The rows of ``data/published_runs.yaml`` the planner can model today, as planner inputs.

The file holds 115 published pre-training measurements (its header names the sources and their
caveats). ``load_runs`` keeps a row only if every rule below holds, and otherwise records the
first rule it breaks (``Exclusion``):

- A GPU with a cluster preset (``CLUSTER_PRESETS``): H100 on ``dgx-h100`` (H100 SXM 80 GB,
  700 W), H200 on ``dgx-h200``, B200 on ``dgx-b200``, GB200 on ``gb200-nvl72``. torchtitan's H100s
  are 96 GB HBM2e parts capped at 500 W (Grand Teton): those rows are *flagged*, predicted on
  dgx-h100 but kept out of the error statistics. The H100 rows' statistics stay apart from the
  other GPUs' (``validate_h100.summary``).
- BF16 only. A null precision counts as BF16 only for the Megatron-LM README rows, whose header
  derives it from TFLOP/s / MFU ~ 989 (the H100 dense BF16 peak); the Megatron-Bridge 25.09
  DeepSeek-V3 row's null precision is left out (its footnote points to FP8). The FP8 rows carry
  the recipe their source states (``published_fp8``; ``fp8_rows`` lists them), checked against
  their source's stack, for when FP8 is priced.
- A layout the planner prices: not expert all-to-alls overlapped with another micro-batch's
  compute (Megatron-Core's 1F1B A2A overlap), nor more model chunks (pp x vpp) than layers, nor
  a token dispatcher other than the all-to-all and DeepEP's (``MoeDispatcher``).
- Context parallelism of a kind the planner prices: ring attention (Megatron-Core's and Transformer
  Engine's default p2p exchange, torch's ring; the rows that do not state theirs) or the
  all-to-all. Not the Llama 3 paper's 128k stage: its context parallelism all-gathers the keys and
  values and then attends with the local queries (Section 3.3.2), a third kind the planner does
  not price (measured as a ring: -3.1%).
- A model the planner builds faithfully: a preset where the row is that model (llama3-8b/70b/405b,
  deepseek-v3, qwen3-235b-a22b; the row's dimensions are checked against it), a family preset
  with the row's dimensions (Kimi K2 on deepseek-v3, Qwen3-30B-A3B on qwen3-235b-a22b), or a
  GPT/MPT block from the row's dimensions. Not built: the Nemotron hybrid Mamba models (no
  architecture in the file) and GPT-OSS (alternating 128-token sliding-window attention and
  head_dim 64 != hidden/heads, neither in the row nor in the planner).
- GPU count, global batch and sequence length stated. torchtitan's null sequence length is read
  as 8192 because the row's notes state that default; no other default is assumed.

Of the rows kept, those whose stack runs kernels with no published rate and no profile here are
predicted and printed, with their errors, but kept out of the statistics under "stack not
described" (``flagged``): LLM Foundry's 8-64 GPU table and the Model Zoo's 4k H100 table.

What the rows leave unstated the planner chooses (``validate_h100``): pins holds what the source
states, in its table or, where the table is silent, in its text (the Llama 3 paper's Section
3.3.2: an interleaved schedule, and no activation checkpointing at 8K tokens). Sources: the
YAML's per-row ``source``; Megatron-LM ``megatron/training/training.py``
``num_floating_point_operations`` for the NVIDIA FLOP formulas (``source_flops_per_sequence``).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from published_fp8 import Fp8Row, Fp8Statement, read_fp8  # the script's folder is on sys.path

from cost_models.layer_work import model_flops_per_sequence
from planner.files.models import load_model
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    Activation,
    AttentionKernel,
    LossMethod,
    ModelSpec,
    MoeDispatcher,
    NormKind,
    PositionEmbedding,
    Recompute,
    RecomputeModule,
    Schedule,
    StackName,
    ZeroStage,
)
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.stacks import STACKS

DATA = Path(__file__).resolve().parent / "data" / "published_runs.yaml"

SOURCES = {
    "NVIDIA Megatron-LM README": "megatron-lm",
    "NVIDIA NeMo Megatron-Bridge performance summary": "mbridge",
    "NVIDIA NeMo AutoModel performance summary": "automodel",
    "NVIDIA Megatron MoE Model Zoo (Qwen3 best practice)": "modelzoo",
    "PyTorch torchtitan benchmarks": "torchtitan",
    "Databricks/MosaicML LLM Foundry": "llm-foundry",
    "Meta, The Llama 3 Herd of Models": "llama3-paper",
}
"""Short names of the sources, by the YAML's source name (prefix match)."""

BF16_NAMES = ("BF16", "amp_bf16")
TORCHTITAN_SEQ_LEN = 8192
"""torchtitan's default llama3 sequence length, as the rows' notes state it."""
PRESETS = {
    "Llama 3 / 3.1 8B": "llama3-8b",
    "Llama 3 / 3.1 70B": "llama3-70b",
    "Llama 3.1 405B": "llama3-405b",
    "Llama 3 405B": "llama3-405b",
    "DeepSeek-V3 671B": "deepseek-v3",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
}
"""Rows that are a preset's model, by the YAML's model name."""
CLUSTER_PRESETS = {"H100": "dgx-h100", "H200": "dgx-h200", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
"""The cluster preset of each GPU type."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceStack:
    """The stack a source's runs were priced for: a named stack (``planner.schemas.stacks``), and
    what the source states or its release ran otherwise, with why."""

    stack: StackName
    overrides: Mapping[str, object] = field(default_factory=dict)
    """TrainingSpec behaviours that differ from the stack's (``stacks.BEHAVIOURS``)."""
    why: str = ""


SOURCE_STACKS = {
    "megatron-lm": SourceStack(
        stack=StackName.MEGATRON_LM,
        overrides={"attention_kernel": AttentionKernel.FLASH},
        why="r0.8's README table does not state its Transformer Engine release, so its attention is priced at "
        "FlashAttention-2's rates, not cuDNN's (its rows run 2,048 tokens, where the attention core is a small "
        "share: cuDNN's rates would move them 2-6 points faster). Its loss is eager, the stack's: r0.8 computes it "
        "with vocab_parallel_cross_entropy unless --cross-entropy-loss-fusion (arguments.py core_r0.8.0: "
        "store_true, off by default), and the README lists the flags its runs set (the overlaps), not that one",
    ),
    "modelzoo": SourceStack(
        stack=StackName.MEGATRON_LM,
        overrides={"loss_kernels": None},
        why="Megatron-Core 2025 with Transformer Engine (cuDNN attention, the stack's); the Model Zoo's launch "
        "scripts set --cross-entropy-loss-fusion, so the loss runs fused as the other kernels",
    ),
    "mbridge": SourceStack(stack=StackName.MEGATRON_BRIDGE),
    "automodel": SourceStack(
        stack=StackName.NEMO_AUTOMODEL,
        why="its rows state 'Kernel optimizations: TE + DeepEP': Transformer Engine's attention, the stack's",
    ),
    "torchtitan": SourceStack(stack=StackName.TORCHTITAN),
    "llm-foundry": SourceStack(
        stack=StackName.LLM_FOUNDRY,
        why="llm-foundry's submit_benchmarks.py sets no torch.compile; MPT's low-precision LayerNorm and GELU are "
        "single kernels either way. The benchmark configs set no loss_fn, so MPT's default fused_crossentropy "
        "holds (modeling_mpt.py at commit 5e85bd62d). Not priced: Composer also evaluates two train metrics after "
        "every micro-batch's backward (use_train_metrics True; LanguageCrossEntropy and LanguagePerplexity each "
        "run a full-vocabulary torch cross-entropy without gradient), about 1-2% of the small models' steps",
    ),
    "llama3-paper": SourceStack(
        stack=StackName.MEGATRON_LM,
        overrides={"attention_kernel": AttentionKernel.FLASH, "loss_kernels": None},
        why="Meta's own stack, priced as Megatron-LM's but for what the paper states or leaves out: no attention "
        "kernel is stated (FlashAttention-2's rates), nor an unfused loss; its pipeline deallocates stage outputs "
        "and inputs once used (sec. 3.3.2), per transfer as Megatron-LM",
    ),
}
"""The stack each source ran (``SOURCES``' short names): how its step is priced beside the
layout, from the one table of stacks (``planner.schemas.stacks.STACKS``). A row's own statements
come on top: tensor-parallel overlap, the MoE dispatcher, and its gradient accumulation steps
as pipeline schedules where its stack runs one per accumulation step
(``Stack.schedule_per_accumulation_step``).

The llm-foundry rows' attention kernel is not one kernel: the 8-64 GPU table ran
submit_benchmarks.py's default ``attn_impl: triton`` (llm-foundry's Triton FlashAttention, a
FlashAttention-1-style kernel), the >= 128 GPU table (sweep.py) ``triton`` for MPT-13b/30b and
``flash`` (flash-attn 2.4.2) for MPT-1b/3b/7b/70b. All are priced at the preset's
FlashAttention-2 rates: no H100 figure of that Triton kernel is published. The flash-attention
README's A100 figure puts it at FlashAttention-1's speed (causal, head dim 128) and its H100 figure
puts FlashAttention-1 at 0.42-0.49 of FlashAttention-2 from 1k to 16k tokens, but the long-sequence
rows (8k-65k tokens, where attention is 20-75% of the step) leave room for about 1 / 1.45 of
FlashAttention-2's rate, not 1 / 2.3: the Triton kernel runs faster on H100 than FlashAttention-1,
by an amount no source states.

What the long-sequence rows' optimism is (measured with this file's inputs): the gap
over the attention core's predicted time is a constant 1.38-1.48 for MPT-7b/13b from 4k to 65k
tokens (rows 90, 91, 93, 94 and the README's other 8-GPU lengths), a kernel rate, not a term
growing with the sequence; the kernel skips masked blocks both ways (flash_attn_triton.py's
causal loop bounds), so the causal halving is not it. The README's A100 table of the same stack
(not in the file) grows the same way on the dgx-a100-80g preset: -11% at 1k, +35% at 65k
(MPT-7b). FSDP's collectives are not it: serializing all of them would add at most 10% (row
89), 1.3% (91), 0.4% (94), 3.5% (96). Row 89 (MPT-30b on 8 GPUs) is 3.2 x, and its 4k row
2.3 x: 56 GiB of model states per GPU leave that run at the edge of its memory (the planner
counts 69 GiB before FSDP's unsharded fp32 gradient, the CUDA context and fragmentation), where
the Triton kernel's larger footprint triggers the allocator's retries (mosaicml/examples pull
request 125: "this can trigger alloc retries which hurts performance"); the same row on A100
is +34% against -5% at 4k. Neither cost is priced.

The stacks as the benchmark scripts built them (submit_benchmarks.py and sweep.py at the tables'
commits): the 8-64 GPU table installed llm-foundry v0.3.0 (torch < 2.1.1, composer 0.16, flash-attn
1.0.9), the >= 128 GPU table the main branch with flash-attn 2.4.2 (torch 2.1.0, composer 0.17).
Both ran FSDP with Composer's ``mixed_precision: DEFAULT`` (the scripts never forward sweep.py's
PURE): weights gathered in bf16, gradients reduced in fp32 (the planner's default under bf16);
no activation checkpointing on the small models, ``limit_all_gathers``, no torch.compile, no
dropout. Not priced: MPT's flash-attn 2 path unpads q, k and v and pads the output in every layer
even without padding (three gathers and a scatter, each unpad syncing the host), and Composer's
per-micro-batch train metrics (the ``SOURCE_STACKS`` entry)."""

GB200_GPUS_PER_TRAY = 4
GB200_TRAYS_PER_RACK = 18


class FlopFormula(StrEnum):
    """How a source counts model FLOPs for its TFLOP/s per GPU."""

    MEGATRON_2024 = "megatron-2024"
    """Megatron-LM r0.8: 12 s l h^2 ((1 + G/a + s/h) q/h + f/h k g + V/(2 l h)), full s x s."""
    MEGATRON_CAUSAL = "megatron-causal"
    """Megatron-LM since 2025: per-GEMM count, attention core over the causal half."""
    PLANNER = "planner"
    """The planner's own ``model_flops_per_sequence`` (full s x s); used where the source's
    formula is not stated (Llama 3 paper)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """What the source states of the layout; None lets the planner choose."""

    tp: int
    pp: int
    dp: int
    ep: int
    virtual_stages: int | None
    schedule: Schedule | None = None
    """The pipeline schedule the source states where it does not state the virtual stages (its
    text's ``pipeline_schedule``, e.g. 'interleaved'); None lets the planner choose, and a stated
    ``virtual_stages`` implies the schedule."""
    cp: int = 1
    """Context-parallel ranks (the row's cp; 1 where it states none)."""
    micro_batch_size: int | None
    zero_stage: ZeroStage | None
    recompute: Recompute | None
    recompute_modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES
    """What the row's selective recompute re-runs (Megatron-Core's ``--recompute-modules``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One selected row: the model, batch, stated layout and published throughput."""

    id: int
    source: str
    """Short name (``SOURCES``)."""
    model: ModelSpec
    gpu_type: str
    """The row's GPU (a ``CLUSTER_PRESETS`` key)."""
    gpus: int
    devices_per_node: int
    """GPUs per NVLink domain as the run used them (``nvlink_domain_gpus``)."""
    global_batch_size: int
    seq_len: int
    pins: Pins
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    flop_formula: FlopFormula
    stack: StackName
    """The stack its source ran (``SOURCE_STACKS``)."""
    behaviours: Mapping[str, object] = field(default_factory=dict)
    """Its behaviours that differ from the stack's: its source's (``SourceStack.overrides``), then
    what the row states (tensor-parallel overlap, the MoE dispatcher, the pipeline schedules a
    step runs)."""
    flagged: str | None = None
    """Why the row is predicted but kept out of the statistics (None: counted)."""
    fp8_recipe: Fp8Recipe | None = None
    """The FP8 recipe its source states (``published_fp8``); None for a BF16 row, or where unstated."""
    fp8_recipe_as_stated: str | None = None
    """The source's words for the recipe, or what it is inferred from; None for a BF16 row."""

    @property
    def published_step_s(self) -> float:
        """Step time the published figure implies: B s / (tokens/s/GPU x GPUs), else the
        source's FLOPs per step / (TFLOP/s per GPU x GPUs)."""
        if self.tokens_per_s_per_gpu is not None:
            return self.global_batch_size * self.seq_len / (self.tokens_per_s_per_gpu * self.gpus)
        assert self.tflops_per_gpu is not None
        return self.source_flops_per_step / (self.tflops_per_gpu * 1e12 * self.gpus)

    @property
    def source_flops_per_step(self) -> float:
        """Model FLOPs of one step as the source counts them."""
        return self.global_batch_size * source_flops_per_sequence(self.model, self.seq_len, self.flop_formula)


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A row left out, and the first rule it breaks."""

    id: int
    source: str
    model: str
    reason: str


def source_flops_per_sequence(model: ModelSpec, seq_len: int, formula: FlopFormula) -> float:
    """Forward + backward model FLOPs of one sequence as ``formula`` counts them.

    Megatron-LM's ``num_floating_point_operations`` (training.py): 3 passes x 2 FLOP per MAC.
    The 2024 form (r0.8) is 12 s l h^2 ((1 + G/a + s/h) (a d / h) + (f/h) k g + V / (2 l h)),
    g = 3/2 for a gated MLP, k the routed experts (1 if dense), attention over the full s x s.
    The causal form counts each GEMM: h (q + k + v) + q s (half of s x s, QK^T and PV) + q h per
    attention layer, h f (2 or 3) per MLP, routed and shared experts per MoE layer, h V logits.
    Standard attention only (MLA rows use the Megatron formula's MLA branch, not needed here).
    """
    if formula is FlopFormula.PLANNER:
        return model_flops_per_sequence(model, seq_len)
    if model.is_mla:
        raise ValueError(f"{formula} is implemented for standard attention only, not {model.name}")
    h, s, l, a = model.hidden_size, seq_len, model.num_hidden_layers, model.num_attention_heads
    gated = model.hidden_act.gated
    q, kv = a * model.head_size, model.kv_heads * model.head_size
    moe_layers = model.num_moe_layers
    k = model.num_experts_per_tok if model.is_moe else 1
    mlp_width = model.expert_ffn_size if model.is_moe else model.ffn_size
    if formula is FlopFormula.MEGATRON_2024:
        g = 1.5 if gated else 1.0
        return (
            12.0
            * s
            * l
            * h
            * h
            * (
                (1 + model.kv_heads / a + s / h) * q / h
                + mlp_width / h * k * g
                + model.shared_ffn_size / h * g
                + model.vocab_size / (2 * l * h)
            )
        )
    matrices = 3 if gated else 2
    dense_layers = l - moe_layers
    mlp = h * matrices * (model.ffn_size * dense_layers + (mlp_width * k + model.shared_ffn_size) * moe_layers)
    attention = l * (h * (q + 2 * kv) + q * s + q * h)
    return 6.0 * s * (mlp + attention + h * model.vocab_size)


def load_runs(path: Path = DATA) -> tuple[tuple[PublishedRun, ...], tuple[Exclusion, ...]]:
    """The selected rows (flagged ones included) and the excluded rows with their reasons."""
    rows = read_rows(path)
    runs: list[PublishedRun] = []
    excluded: list[Exclusion] = []
    for row in rows:
        source = _short_source(row["source"]["name"])
        fp8 = read_fp8(row, SOURCE_STACKS[source].stack)  # checks every FP8 row, excluded or not
        reason = _exclusion_reason(row, source)
        if reason is not None:
            excluded.append(Exclusion(row["id"], source, row["model"]["name"], reason))
            continue
        runs.append(_run(row, source, fp8))
    return tuple(runs), tuple(excluded)


def read_rows(path: Path = DATA) -> list[dict[str, Any]]:
    """Every row of the file, as written."""
    rows: list[dict[str, Any]] = yaml.safe_load(path.read_text())
    return rows


def run_of(row: Mapping[str, Any]) -> PublishedRun:
    """A row as planner inputs, whatever rule it breaks (``load_runs`` applies them): for a
    benchmark that reads what the throughput rules leave out, e.g. a stated peak memory."""
    source = _short_source(row["source"]["name"])
    return _run(row, source, read_fp8(row, SOURCE_STACKS[source].stack))


def fp8_rows(path: Path = DATA) -> tuple[Fp8Row, ...]:
    """Every FP8 row's recipe as its source states it, with the stack its source maps to
    (``SOURCE_STACKS``); checked as ``load_runs`` checks them. These rows are excluded today."""
    rows: list[dict[str, Any]] = yaml.safe_load(path.read_text())
    out: list[Fp8Row] = []
    for row in rows:
        source = _short_source(row["source"]["name"])
        stack = SOURCE_STACKS[source].stack
        fp8 = read_fp8(row, stack)
        if fp8 is not None:
            out.append(Fp8Row(id=row["id"], source=source, stack=stack, recipe=fp8.recipe, as_stated=fp8.as_stated))
    return tuple(out)


def _short_source(name: str) -> str:
    for prefix, short in SOURCES.items():
        if name.startswith(prefix):
            return short
    raise ValueError(f"unknown source {name!r}; add it to SOURCES")


def _exclusion_reason(row: Mapping[str, Any], source: str) -> str | None:
    gpu, model, par = row["gpu"], row["model"], row["parallel"]
    precision = row["precision"]
    if gpu["type"] not in CLUSTER_PRESETS:
        return f"GPU {gpu['type']}: no cluster preset ({', '.join(CLUSTER_PRESETS.values())})"
    if precision is None and source != "megatron-lm" and row.get("fp8_recipe") is None:
        return "precision not stated (Megatron-Bridge 25.09 footnote implies FP8)"
    if precision is not None and precision not in BF16_NAMES and row.get("fp8_recipe") is None:
        return "FP8 recipe not stated by the source"
    if (par["cp"] or 1) > 1 and source == "llama3-paper":
        return "context parallelism by all-gathered keys and values (Llama 3 paper): a kind not priced"
    if model["n_layers"] is None:
        return "hybrid Mamba-Transformer: architecture not in the file"
    if model["name"].startswith("GPT-OSS"):
        return "GPT-OSS: sliding-window attention and head_dim 64 != hidden/heads not modelled"
    if gpu["count"] is None:
        return "GPU count not stated"
    if row["global_batch_size_seqs"] is None:
        return "global batch not stated"
    if row["seq_len"] is None and source != "torchtitan":
        return "sequence length not stated"
    tp, pp, cp = par["tp"] or 1, par["pp"] or 1, par["cp"] or 1
    if par["dp"] is not None and par["dp"] * tp * pp * cp != gpu["count"]:
        return f"stated dp={par['dp']} x tp={tp} x pp={pp} x cp={cp} != {gpu['count']} GPUs"
    if gpu["type"] == "GB200" and source != "mbridge":
        return "GB200: the NVLink domain the run used is not stated"
    if par.get("ep_comm_overlap"):
        return "expert all-to-all behind another micro-batch's compute (Megatron-Core's 1F1B overlap): not priced"
    if par.get("moe_dispatcher") not in (None, *MoeDispatcher):
        return f"MoE dispatcher {par['moe_dispatcher']}: not priced"
    if pp * (par["vpp"] or 1) > model["n_layers"]:
        return f"pp x vpp = {pp * par['vpp']} model chunks for {model['n_layers']} layers: empty chunks not priced"
    return None


def nvlink_domain_gpus(gpu_type: str, gpus: int) -> int:
    """GPUs per NVLink domain as the run used them: a DGX node's 8, or on GB200 NVL72 the
    Megatron-Bridge launcher's Slurm segment (scripts/performance/utils/executors.py): with 4 GPUs
    per tray the job asks for segments of the largest tray count <= 18 that divides its trays,
    e.g. 16 trays (64 GPUs) of a rack for a 256-GPU job."""
    if gpu_type != "GB200":
        return 8
    trays = gpus // GB200_GPUS_PER_TRAY
    segment = next(n for n in range(min(trays, GB200_TRAYS_PER_RACK), 0, -1) if trays % n == 0)
    return segment * GB200_GPUS_PER_TRAY


def _run(row: Mapping[str, Any], source: str, fp8: Fp8Statement | None = None) -> PublishedRun:
    par, out = row["parallel"], row["throughput"]
    gpus = row["gpu"]["count"]
    tp, pp, cp = par["tp"] or 1, par["pp"] or 1, par["cp"] or 1
    vpp = par["vpp"]
    return PublishedRun(
        id=row["id"],
        source=source,
        model=_model(row["model"], source, row["seq_len"]),
        gpu_type=row["gpu"]["type"],
        gpus=gpus,
        devices_per_node=nvlink_domain_gpus(row["gpu"]["type"], gpus),
        global_batch_size=row["global_batch_size_seqs"],
        seq_len=row["seq_len"] or TORCHTITAN_SEQ_LEN,
        pins=Pins(
            tp=tp,
            pp=pp,
            dp=gpus // (tp * pp * cp),
            cp=cp,
            ep=par["ep"] or 1,
            virtual_stages=1 if pp == 1 else vpp,
            schedule=_schedule(par.get("pipeline_schedule")),
            micro_batch_size=row["micro_batch_size"],
            zero_stage=_zero_stage(par),
            recompute=_recompute(par["activation_recompute"]),
            recompute_modules=_recompute_modules(par["activation_recompute"]),
        ),
        tokens_per_s_per_gpu=out["tokens_per_s_per_gpu"],
        tflops_per_gpu=out["tflops_per_gpu"],
        flop_formula={"megatron-lm": FlopFormula.MEGATRON_2024, "modelzoo": FlopFormula.MEGATRON_CAUSAL}.get(
            source, FlopFormula.PLANNER
        ),
        stack=SOURCE_STACKS[source].stack,
        behaviours=_behaviours(source, row),
        flagged=flagged(source, row),
        fp8_recipe=None if fp8 is None else fp8.recipe,
        fp8_recipe_as_stated=None if fp8 is None else fp8.as_stated,
    )


UNDESCRIBED_STACK = "stack not described"
"""A row counts toward the error statistics only where the planner can know the speed of every
kernel its stack runs, from a published figure or a measured profile; the others are predicted
and printed beside the statistics with this reason (the rule is by stack, stated before errors)."""


def flagged(source: str, row: Mapping[str, Any]) -> str | None:
    """Why a row is predicted but kept out of the statistics, or None where it counts:
    torchtitan's H100s are a part no preset describes; LLM Foundry's 8-64 GPU table ran torch 2.0's
    eager kernels, flash-attn 1.0.9's Triton ALiBi attention and Composer's FSDP1, whose speeds no
    published figure or profile here gives (its >= 128 GPU table ran FlashAttention-2); the Model
    Zoo's 4k-token H100 table states neither its routing (forced balance or dropless) nor what its
    code branches change."""
    if source == "torchtitan":
        return "torchtitan H100: 96 GB HBM2e at 500 W"
    section = str(row["source"].get("section", ""))
    if source == "llm-foundry" and "Large Scale" not in section:
        return f"{UNDESCRIBED_STACK}: torch 2.0 eager kernels, flash-attn 1.0.9 Triton ALiBi attention, Composer FSDP1"
    if source == "modelzoo" and "Routing (forced balance or dropless) not stated" in str(row.get("notes", "")):
        return f"{UNDESCRIBED_STACK}: routing (forced balance or dropless) and code branch not stated"
    return None


def _behaviours(source: str, row: Mapping[str, Any]) -> dict[str, object]:
    """The row's behaviours beside its source's stack (``PublishedRun.behaviours``)."""
    par = row["parallel"]
    chosen = SOURCE_STACKS[source]
    behaviours = dict(chosen.overrides)
    if par.get("tp_comm_overlap"):
        behaviours["tp_comm_overlap"] = True
    if par.get("moe_dispatcher"):
        behaviours["moe_dispatcher"] = MoeDispatcher(par["moe_dispatcher"])
    if STACKS[chosen.stack].schedule_per_accumulation_step and (par["pp"] or 1) > 1:
        behaviours["pipeline_flushes"] = row["grad_accum_steps"] or 1
    if EAGER_LOSS_RELEASE in row["source"]["url"]:
        behaviours["loss_method"] = LossMethod.FP32_EAGER
    return behaviours


EAGER_LOSS_RELEASE = "llama3_h100_202412_torchtitan"
"""The table whose release left the loss uncompiled, the one row-level exception to its source's
stack: torchtitan's train.py at 9dec370 defines ``loss_fn`` as ``F.cross_entropy(pred.flatten(0,
1).float(), ...)`` and leaves its ``torch.compile`` commented out ("TODO: compiling loss function
causes CUDA errors"); its 2025 releases compile the loss with the model (``build_cross_entropy_loss``),
the stack's value."""


def _zero_stage(par: Mapping[str, Any]) -> ZeroStage | None:
    """ZeRO stage the source states: its zero_stage; FSDP > 0 (Megatron-Bridge, AutoModel,
    torchtitan) is ZeRO-3; the Llama 3 paper's 'DP is FSDP' shards optimizer states and
    gradients (ZeRO-2, the row's text); a distributed optimizer is ZeRO-1; else not stated."""
    if par["zero_stage"] is not None:
        return ZeroStage(par["zero_stage"])
    fsdp = par["fsdp"]
    if isinstance(fsdp, str):
        return ZeroStage.GRADIENTS
    if fsdp:
        return ZeroStage.PARAMETERS
    if par["distributed_optimizer"]:
        return ZeroStage.OPTIMIZER
    return None


def _schedule(text: str | None) -> Schedule | None:
    """The pipeline schedule a source's text names ('interleaved (...)', '1f1b (...)'); None where
    it names none."""
    if text is None:
        return None
    for schedule in Schedule:
        if text.startswith(schedule.value):
            return schedule
    raise ValueError(f"unknown pipeline_schedule {text!r}")


def _recompute(text: str | None) -> Recompute | None:
    """The source's recomputation: 'full...', 'selective...' (torchtitan's selective
    checkpointing, a coarser match of the planner's attention-core selective; Megatron's
    'selective (m1, m2)' names its recompute modules, ``_recompute_modules``), 'none'; None lets
    the planner choose, where not stated."""
    if text is None:
        return None
    for mode in (Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE):
        if text.startswith(mode.value):
            return mode
    raise ValueError(f"unknown activation_recompute {text!r}")


def _recompute_modules(text: str | None) -> tuple[RecomputeModule, ...]:
    """The modules of a Megatron 'selective (layernorm, moe)' (its ``--recompute-modules``); the
    attention core alone (Megatron-Core's default) for any other text."""
    if text is None or not text.startswith(Recompute.SELECTIVE.value) or "(" not in text:
        return DEFAULT_RECOMPUTE_MODULES
    names = [n.strip() for n in text[text.index("(") + 1 : text.rindex(")")].split(",")]
    known = {m.value for m in RecomputeModule}
    if not all(n in known for n in names):  # torchtitan's '(per-op SAC)', '(default llama3_8b.toml)'
        return DEFAULT_RECOMPUTE_MODULES
    return tuple(m for m in RecomputeModule if m.value in names)


def _model(spec: Mapping[str, Any], source: str, seq_len: int | None) -> ModelSpec:
    name = spec["name"]
    if name in PRESETS:
        preset = load_model(PRESETS[name])
        _check_dims(preset, spec)
        return preset.model_copy(update={"vocab_size": spec["vocab"]})
    if name == "Kimi K2":
        # DeepSeek-V3's architecture (MLA, 1 shared expert, ...) with the row's heads, experts and
        # vocabulary; first_k_dense_replace stays DeepSeek-V3's 3 (the row does not state it).
        base = load_model("deepseek-v3").model_dump()
        return ModelSpec.model_validate(
            {**base, "name": "kimi-k2", "num_attention_heads": spec["n_heads"], "num_key_value_heads": spec["n_heads"]}
            | {"num_local_experts": 384, "vocab_size": spec["vocab"]}
        )
    if name == "Qwen3-30B-A3B":
        # The qwen3-235b-a22b preset's family (head_dim 128, q/k norms, untied) with the row's sizes.
        base = load_model("qwen3-235b-a22b").model_dump()
        return ModelSpec.model_validate(
            {**base, "name": "qwen3-30b-a3b", "hidden_size": spec["hidden"], "num_hidden_layers": spec["n_layers"]}
            | {"num_attention_heads": spec["n_heads"], "num_key_value_heads": spec["n_kv_heads"]}
            | {"num_local_experts": spec["n_experts"], "num_experts_per_tok": spec["top_k"]}
            | {"moe_intermediate_size": spec["expert_ffn_hidden"], "vocab_size": spec["vocab"]}
        )
    if source == "megatron-lm":
        # Megatron-LM's GPT defaults: LayerNorm, biases, GELU, learned positions, tied embeddings;
        # the README states no MLP width, so f = 4h (Megatron's default).
        return ModelSpec(
            name=f"gpt-{name.split()[1].lower()}",
            hidden_size=spec["hidden"],
            num_hidden_layers=spec["n_layers"],
            num_attention_heads=spec["n_heads"],
            vocab_size=spec["vocab"],
            hidden_act=Activation.GELU,
            max_position_embeddings=seq_len or 4096,
            position_embedding_type=PositionEmbedding.ABSOLUTE,
            norm_type=NormKind.LAYERNORM,
            attention_bias=True,
            mlp_bias=True,
        )
    if source == "llm-foundry":
        # MPT as the benchmark built it: LayerNorm without biases, GELU, tied embeddings, and
        # learned positions over max_seq_len, not ALiBi: llm-foundry's pretrain yamls
        # (scripts/train/yamls/pretrain/mpt-*.yaml) set no attn_config.alibi, so MPTConfig's
        # defaults hold (alibi False, learned_pos_emb True), and the README's NumParams grows by
        # d_model per token of SeqLen (MPT-7b: 6,918,905,856 at 65,536 - 6,658,859,008 at 2,048
        # = 63,488 x 4,096). The YAML's "ALiBi" describes the released MPT checkpoints.
        return ModelSpec(
            name=name.lower(),
            hidden_size=spec["hidden"],
            num_hidden_layers=spec["n_layers"],
            num_attention_heads=spec["n_heads"],
            intermediate_size=spec["ffn_hidden"],
            vocab_size=spec["vocab"],
            hidden_act=Activation.GELU,
            max_position_embeddings=seq_len or 2048,
            position_embedding_type=PositionEmbedding.ABSOLUTE,
            norm_type=NormKind.LAYERNORM,
            tie_word_embeddings=True,
        )
    raise ValueError(f"no model builder for {name!r} ({source})")


def _check_dims(preset: ModelSpec, spec: Mapping[str, Any]) -> None:
    """The row's stated dimensions must be the preset's (vocabulary aside: the row's is used)."""
    pairs = {
        "n_layers": preset.num_hidden_layers,
        "hidden": preset.hidden_size,
        "n_heads": preset.num_attention_heads,
        "n_kv_heads": preset.kv_heads,
        "ffn_hidden": preset.ffn_size,
        "expert_ffn_hidden": preset.expert_ffn_size,
        "top_k": preset.num_experts_per_tok,
    }
    for key, value in pairs.items():
        stated = spec.get(key)
        if stated is not None and stated != value:
            raise ValueError(f"{spec['name']}: {key}={stated} but preset has {value}")
