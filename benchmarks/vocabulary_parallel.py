"""The vocabulary layouts in the setting of the Vocabulary Parallelism paper's own experiments,
predicted beside what the paper published.

Setting (Yeung, Qi, Lin, Wan, "Balancing Pipeline Parallelism with Vocabulary Parallelism",
MLSys 2025, Table 1 and its artifact, github.com/sail-sg/VocabularyParallelism): one node of 8
A100 80GB, pipeline 8 (no data or tensor parallelism), 1F1B, micro-batch 1, 128 micro-batches,
fp16, FlashAttention; a 32-layer GPT (hidden 3072, 24 heads, MLP 12288, untied embeddings);
sequence 2048 and 4096; vocabulary 32k, 64k, 128k and 256k. Layouts:
- Baseline: the vocabulary layers pinned to the first and last stage, 4 layers a stage;
- Redis: pinned, the last stage given N layers and the rest spread over the others (the paper's
  layer redistribution; it picked N = 4, 3, 2, 0 for 32k-256k); here the N the model finds fastest;
- Vocab-1, Vocab-2: split over the pipeline (Algorithms 1 and 2).
Also, as extra rows: pinned with Megatron-LM's split counting the embedding and the loss as layers.

Published: Table 5 of the paper (v1, as transcribed from arXiv 2411.05288 and checked against
the artifact's exp_one_host.csv): MFU (%) against a 312 TFLOPS peak, and peak memory (GB, read
here as GiB). Model FLOPs are counted as the paper counts them (3 x the forward, attention over
the full s x s, the output layer included: ``layer_work.model_flops_per_sequence``), so the MFU
columns compare directly.

Run: .venv/bin/python benchmarks/vocabulary_parallel.py
"""

from dataclasses import replace

from planner import api
from planner.schemas import DType, Layout, TrainingSpec, VocabularyLayout
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import accounted_split

VOCABULARIES = (32_000, 64_000, 128_000, 256_000)
PUBLISHED = {  # (seq, method): (MFU % per vocabulary, peak GB per vocabulary)
    (2048, "Baseline"): ((46.16, 40.48, 33.11, 25.23), (14.86, 16.32, 19.25, 25.64)),
    (2048, "Redis"): ((46.01, 46.37, 44.22, 38.91), (14.86, 16.32, 19.25, 25.64)),
    (2048, "Vocab-1"): ((50.42, 50.28, 49.93, 50.12), (15.63, 16.02, 16.84, 18.59)),
    (2048, "Vocab-2"): ((50.23, 50.18, 49.82, 49.69), (14.83, 15.23, 16.04, 17.78)),
    (4096, "Baseline"): ((47.05, 41.87, 35.00, 26.75), (21.39, 22.85, 25.78, 31.64)),
    (4096, "Redis"): ((46.93, 46.78, 47.44, 43.01), (21.39, 22.85, 25.78, 31.64)),
    (4096, "Vocab-1"): ((50.98, 50.98, 50.83, 50.66), (24.04, 24.47, 25.41, 27.34)),
    (4096, "Vocab-2"): ((50.93, 50.75, 50.56, 50.40), (22.44, 22.89, 23.80, 25.73)),
}
LAYERS, STAGES = 32, 8


def _redis_split(last: int) -> tuple[int, ...]:
    """The paper's layer redistribution: the last stage ``last`` layers, the others the rest,
    the remainder to the stages just before the last."""
    base, extra = divmod(LAYERS - last, STAGES - 1)
    return (*(base + (1 if s >= STAGES - 1 - extra else 0) for s in range(STAGES - 1)), last)


def main() -> None:
    """Print predicted against published MFU and peak memory for every setting and layout."""
    cluster = api.load_cluster("dgx-a100-80g:1")
    base = api.load_model("gpt3-175b")
    layout = Layout(
        data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=STAGES, micro_batch_size=1
    )
    print("8 A100 80GB, pp 8, 1F1B, b 1, 128 micro-batches, fp16; 32 layers, h 3072, 24 heads, MLP 12288")
    print("MFU % and peak GiB: ours / published (Table 5)")
    for seq in (2048, 4096):
        # the paper's own schedule: its vocabulary collectives behind the layers
        training = TrainingSpec(global_batch_size=128, seq_len=seq, dtype=DType.FP16, vocabulary_overlap=True)
        rows: dict[str, list[str]] = {}
        for i, vocab in enumerate(VOCABULARIES):
            model = base.model_copy(
                update={
                    "name": f"vp-4b-{vocab // 1000}k",
                    "num_hidden_layers": LAYERS,
                    "hidden_size": 3072,
                    "num_attention_heads": 24,
                    "num_key_value_heads": 24,
                    "intermediate_size": 12288,
                    "vocab_size": vocab,
                    "tie_word_embeddings": False,
                    "max_position_embeddings": seq,
                }
            )
            redis = []
            for last in range(5):
                try:
                    est = api.estimate(model, cluster, training, replace(layout, layer_split=_redis_split(last)))
                except InfeasibleConfigError:
                    continue
                redis.append((est.step_time_s, last, est))
            _, best_last, redis_est = min(redis, key=lambda r: r[0])
            layouts = {
                "Baseline": api.estimate(model, cluster, training, layout),
                "Redis": redis_est,
                "Vocab-1": api.estimate(
                    model, cluster, training, replace(layout, vocabulary_layout=VocabularyLayout.VOCAB_1)
                ),
                "Vocab-2": api.estimate(
                    model, cluster, training, replace(layout, vocabulary_layout=VocabularyLayout.VOCAB_2)
                ),
                "Megatron counted": api.estimate(
                    model, cluster, training, replace(layout, layer_split=accounted_split(LAYERS, STAGES))
                ),
            }
            for method, est in layouts.items():
                mfu, mem = PUBLISHED.get((seq, method), ((None,) * 4, (None,) * 4))
                ours = f"{est.mfu * 100:5.1f}/{mfu[i] if mfu[i] else '  -  '} {est.peak_memory_bytes / 2**30:5.1f}/"
                ours += f"{mem[i] if mem[i] else '  -  '}"
                ours += f" N={best_last}" if method == "Redis" else "    "
                rows.setdefault(method, []).append(ours)
        print(f"\nseq {seq}: " + " | ".join(f"{v // 1000}k: MFU ours/pub, GiB ours/pub" for v in VOCABULARIES))
        for method, cells in rows.items():
            print(f"  {method:16s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
