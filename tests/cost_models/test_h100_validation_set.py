"""The cost model against the published BF16 runs of benchmarks/data/published_runs.yaml
(benchmarks/validate_h100.py): a regression guard on today's error on the H100 rows, the GB200
rows kept apart, and the FLOP formulas the sources' TFLOP/s are converted with."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from published_h100 import FlopFormula, load_runs, source_flops_per_sequence
from validate_h100 import cluster_of, predict, summary

from cost_models.layer_work import model_flops_per_sequence
from planner.files.models import load_model


@pytest.fixture(scope="module")
def selection() -> tuple[int, int, int]:
    runs, excluded = load_runs()
    h100 = [r for r in runs if r.gpu_type == "H100"]
    return sum(r.flagged is None for r in h100), sum(r.flagged is not None for r in h100), len(excluded)


def test_selection_counts_36_rows_flags_25_and_excludes_42(selection: tuple[int, int, int]) -> None:
    # A change here changes what the error below averages over: re-measure it. 65 rows were
    # excluded before the H200, B200 and GB200 presets; the GB200 BF16 rows 33 and 36 are now
    # predicted (their statistics kept apart, test below); the H200 and B200 rows stay excluded
    # (FP8, GPT-OSS). The context-parallel rows of kinds the planner prices (38, 103-105) joined
    # when ring attention's steps were priced at their own masks. The Model Zoo's 4k-token H100
    # table (rows 107-111) was added to the file later: 3 rows kept, 108 (1F1B A2A overlap) and
    # 110 (96 model chunks for 94 layers) excluded. torchtitan's async-TP float8 rowwise rows
    # (112-115) were added for the FP8-vs-BF16 pairs: excluded as FP8, as their BF16 pairs 66-71
    # are for their unstated global batch. Flagged: torchtitan's 4 (a part no preset describes)
    # and, by the rule that a row counts only where the planner can know the speed of every kernel
    # its stack runs, the 13 rows of undescribed stacks: LLM Foundry's 8-64 GPU table (87-96:
    # torch 2.0 eager kernels, flash-attn 1.0.9's Triton ALiBi attention, Composer FSDP1) and the
    # Model Zoo's 4k-token H100 table (107, 109, 111: routing and code branch not stated).
    # That was (31, 17, 65). FP8 rows entered once FP8 was priced, each with the recipe its source
    # states (published_fp8): 9 H100 rows counted (Megatron-Bridge's FP8-CS, tensorwise), 8
    # flagged (torchtitan's 6 float8 rows, a part no preset describes; LLM Foundry's 2 amp_fp8
    # rows, an undescribed stack), and of the 27 FP8 rows left out before, those on other GPUs
    # now predicted apart (B200, GB200); the rest stay excluded for other reasons (the global
    # batch or GPU count not stated, GPT-OSS). Bridge's Qwen3 H100 rows then left (36, 25, 42): the
    # performance scripts that produced them run 14, 15 and 19 with the 1F1B expert all-to-all
    # overlap (moe_a2a_overlap=True) and 20 with the Hybrid-EP dispatcher, neither priced. Bridge's
    # B200 DeepSeek-V3 row 28 (26.04.01) ran the workload config of its layout, which overlaps the
    # expert all-to-all too (DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2): (36, 25, 43).
    assert selection == (36, 25, 43)


def test_the_gb200_rows_run_in_nvlink_domains_of_64_gpus() -> None:
    # Megatron-Bridge's launcher puts a 64-tray GB200 job in Slurm segments of 16 trays (4 GPUs
    # each): 4 NVLink domains of 64 GPUs for 256 GPUs, each a node of the gb200-nvl72 preset.
    runs, _ = load_runs()
    gb200 = [r for r in runs if r.gpu_type == "GB200" and r.gpus == 256]
    assert [(r.id, r.gpus, r.devices_per_node) for r in gb200] == [
        (32, 256, 64),
        (33, 256, 64),
        (34, 256, 64),
        (36, 256, 64),
    ]
    cluster = cluster_of(gb200[0])
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.intra_node_links.size) == (4, 64, 64)
    assert cluster.device.name == "NVIDIA GB200"


def test_mean_error_is_no_worse_than_today() -> None:
    # The validation target is a mean |error| <= 8% and a worst <= 15%. Measured when this guard was
    # written (dgx-h100 preset, nothing fitted): mean 22.8%, worst 79.8% (Model Zoo Qwen3-235B,
    # expert all-to-all across nodes); per source megatron-lm 7.9%, automodel 22.0%,
    # llm-foundry 26.8%, llama3-paper 20.6%, modelzoo 79.8%. With the attention core at
    # FlashAttention-2's published H100 rates (not the matmul rate): mean 18.5%, worst 80.5%
    # (the same row); megatron-lm 7.2%, automodel 22.4%, llm-foundry 19.3%, llama3-paper 22.3%,
    # modelzoo 80.5%. With expert tensor parallelism 1 (MoE parallel folding, as the Model Zoo runs
    # it: its ep 8 group in one node) the Qwen3 row is -32.9%: mean 17.2%, worst 46.2% (llm-foundry mpt-30b, row 89).
    # With overlapped data-parallel communication costing its slowdown and its edges, and the
    # Megatron-LM rows' stated --tp-comm-overlap priced: mean 16.9%, worst 43.7% (row 89);
    # megatron-lm 10.7% (hidden TP time leaves their compute too fast), llm-foundry 17.2%.
    # With the AutoModel MoE rows' stated DeepEP dispatcher (a token crosses to each remote node
    # once): automodel 23.0% -> 7.3%, mean 15.2%, worst 43.7%.
    # With the Megatron-LM README rows' loss unfused (Megatron-LM r0.8's default, no
    # --cross-entropy-loss-fusion): megatron-lm 8.9% -> 7.2% (gpt-1.7b +20.2% -> +11.2%),
    # mean 14.0% -> 13.6%, worst 42.7% (row 89).
    # With a dense model's selective recompute of the MLP searched (Llama 3 405B fits without full
    # recompute): llama3-paper 22.6% -> 16.0%. With the Transformer Engine stacks' attention at
    # cuDNN's published H100 rates (AttentionKernel.CUDNN): modelzoo -23.1% -> -9.4%, automodel
    # 7.5% -> 9.4% (worst 18.0% -> 12.8%); mean 12.9% -> 12.4%, worst 42.3% (row 89). With the
    # llm-foundry rows' loss fused, as MPT's default fused_crossentropy runs it (it was priced eager):
    # llm-foundry 15.9% -> 16.8%, mean 12.4% -> 12.9%, worst 42.5% (row 89). With the AutoModel rows'
    # stated gradient accumulation run as that many pipeline schedules (TrainingSpec.pipeline_flushes):
    # automodel 9.4% -> 6.4% (row 39 +3.5% -> -1.8%, row 41 +11.9% -> +1.5%; each schedule also
    # reduce-scatters its gradients), mean 12.9% -> 12.6%. With the Llama 3 rows' recompute and
    # schedule as the paper's text states them (Section 3.3.2: interleaved, no activation
    # checkpointing at 8K tokens; the search had chosen MLP recompute to fit the planner's memory
    # model): llama3-paper 16.0% -> 2.5% (rows 99 +3.6%, 100 +1.4%, both '!': the planner's memory
    # model, our runtime's, does not fit them), mean 12.6% -> 11.8%. With ring attention's
    # off-diagonal blocks at the kernel's unmasked rates (FA3 paper), the context-parallel rows
    # join the set (41 rows): AutoModel's 70B cp2 +7.9%, the Model Zoo's Qwen3-235B at 32k-128k
    # -11.2%, -12.5%, -11.7% (at the causal rates -13.1%, -16.5%, -17.5%); mean 11.7%. Left out:
    # the Llama 3 paper's 128k stage, whose all-gather context parallelism is not priced.
    # The Model Zoo's 4k-token H100 table joined the file (rows 107, 109, 111 kept): +6.9%
    # (TP2 EP32 across nodes), -25.2% (FSDP dp128, EP8, full recompute), +44.9% (TP4 EP8 PP8);
    # modelzoo 11.2% -> 17.4%, mean 11.7% -> 12.7%, worst 42.5% -> 44.9% (row 111). The bounds
    # below rose with the set, not with the model: on the 41 rows before it they stay 11.7%, 42.5%.
    # When the pipeline's receive buffers were priced (TrainingSpec.pipeline_buffers: the AutoModel rows'
    # torch.distributed.pipelining keeps one per micro-batch, the Megatron-Core sources' are per transfer),
    # AutoModel's Kimi-K2 at pp 8 x 4 chunks (row 41) needed 78.6 GiB of 75.7 usable (4.4 GiB of buffers)
    # where it ran in 80 GB, so it fell to the fastest layout unfitted: +1.5% -> +32.3%, automodel 6.7% ->
    # 12.8%, mean 12.7% -> 13.4%. The memory model that stays conservative there (ZeRO-3 under a pipeline
    # holds what ZeRO-1 holds, as our runtime's FSDP does) is what the bound rose with.
    # With the rows of undescribed stacks flagged (the selection test above: 44 -> 31 rows counted),
    # by a rule stated per stack before the errors: llm-foundry 16.8% -> 14.2% (11 rows, worst
    # 34.3%, the >= 128 GPU table's MPT-1B), modelzoo 17.4% -> 11.2%, mean 13.4% -> 10.2%, worst
    # 44.9% -> 34.3%.
    # Lower these bounds as the model improves.
    # The GB200 rows (rows 33, 36) are summarised apart, under "GB200": with the gb200-nvl72
    # preset, nothing fitted, DeepSeek-V3 -20.9% and Qwen3-235B -4.3% (mean 12.6%); with the
    # preset's cuDNN and FlashAttention-2 rates from cudnn-frontend's GB200 benchmark (the attention
    # core was priced at the matmul rate): -13.7% and -0.5% (mean 7.1%).
    # The FP8 rows (Megatron-Bridge's 9 FP8-CS H100 rows) are summarised apart ("overall fp8") and
    # do not move the BF16 figures above. When FP8 was first priced (linear GEMMs at each preset's
    # measured FP8 rate, quantization passes at memory bandwidth): mean 30.4%, worst 92.1% (row 14,
    # Qwen3-30B-A3B at pp 2 x 24 virtual stages, one layer a chunk, published 40% below the same
    # model's ep16 row 20, which the model prices -11.4%); the dense Llama rows -13% to -22%.
    # With Transformer Engine's FP8 weight copies and FP8 saved inputs priced: the Qwen3-235B rows
    # fit without recompute (-34.1% -> -10.7%, -38.7% -> -17.0%): mean 25.3%, worst 92.1%. The
    # dense Llama rows' tensor-parallel time (14-20% of the step) is exposed as priced: the rows do
    # not state Megatron Bridge's communication overlap, which its H100 recipes may turn on.
    # With the sequence-parallel all-gathers in FP8 (Transformer Engine gathers quantized inputs):
    # mean 24.5%. With the Bridge Llama rows' tensor-parallel overlap that the recipes its
    # performance scripts build on turn on (CommOverlapConfig(tp_comm_overlap=True)): 70B -18.9%
    # -> -10.2%, 405B -18.5% / -20.4% -> -5.1% / -6.9%; mean 19.6%. With cuDNN's fused attention
    # at cuDNN 9.19's rates (cudnn-frontend's H200 benchmark, the containers' cuDNN) instead of the
    # FA3 paper's cuDNN 9.1 bars: bf16 10.2% -> 9.1% (modelzoo 11.2% -> 2.7%, automodel 12.8% ->
    # 13.3%). The Qwen3 rows excluded as their scripts ran them (the selection test above: row 14
    # +96%, 15 -9.5%, 19 -15.9% with an overlap not priced; 20 -10.0% with a dispatcher not
    # priced): the 5 dense Llama rows, mean 7.1%, worst 9.5% (Llama 3 8B under FSDP, row 10).
    # With the full recompute NeMo AutoModel's benchmark configs state for its MoE rows
    # (activation_checkpointing: true), which the planner had left to choose, and under which Kimi
    # K2 and Qwen3-30B-A3B still fit no candidate ('!'): automodel 13.3% -> 7.8% (row 41 +33.4% ->
    # +2.5%, row 42 +12.3% -> -15.5%), bf16 9.1% -> 8.2%.
    runs, _ = load_runs()
    stats = summary([predict(r) for r in runs])
    mean, worst, rows = stats["overall bf16"]
    assert rows == 31
    assert mean <= 0.085
    assert worst <= 0.35
    fp8_mean, fp8_worst, fp8_rows = stats["overall fp8"]
    assert fp8_rows == 5
    assert fp8_mean <= 0.075
    assert fp8_worst <= 0.10
    assert stats["GB200"][2] == 6


def test_megatron_2024_formula_is_the_planners_count_for_a_gpt_block() -> None:
    # Both count 72 s l h^2 (1 + s/(6h) + V/(12 l h)) per sequence for a GPT block (4h MLP, MHA).
    gpt = load_model("gpt3-175b")
    ours = model_flops_per_sequence(gpt, 2048)
    assert source_flops_per_sequence(gpt, 2048, FlopFormula.MEGATRON_2024) == pytest.approx(ours, rel=1e-12)
    h, s, l, v = gpt.hidden_size, 2048, gpt.num_hidden_layers, gpt.vocab_size
    assert ours == pytest.approx(72 * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h)), rel=1e-12)


def test_causal_megatron_formula_matches_the_model_zoos_own_tflops() -> None:
    # Megatron MoE Model Zoo, Qwen3 best practice, H100 table: Qwen3-235B-A22B, 256 GPUs,
    # s = 4096, GBS 2048, step 19.7 s, 245 TFLOP/s per GPU. Those imply 245e12 * 256 * 19.7 /
    # (2048 * 4096) = 147.3 GFLOP per token; the causal formula gives 148.0 (the router is not
    # counted). The full s x s count would give 167, 13% more.
    qwen = load_model("qwen3-235b-a22b")
    per_token = source_flops_per_sequence(qwen, 4096, FlopFormula.MEGATRON_CAUSAL) / 4096
    assert per_token == pytest.approx(245e12 * 256 * 19.7 / (2048 * 4096), rel=0.01)
    assert source_flops_per_sequence(qwen, 4096, FlopFormula.MEGATRON_2024) / 4096 > 1.1 * per_token
