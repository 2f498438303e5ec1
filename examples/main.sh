#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: set up, then predict.
# Today the planner predicts from presets; the profiler, search and runtime issues extend this
# script to profile the local CPU cluster, search a plan and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
planner=.venv/bin/planner

echo "== Llama 3 70B on 8 DGX H100 nodes: tp 8, pp 4, dp 2, ZeRO-1, selective recompute"
"$planner" estimate --model llama3-70b --cluster dgx-h100:8 --global-batch-size 512 --seq-len 8192 \
    --dp 2 --tp 8 --pp 4 --micro-batch-size 1 --zero-stage 1 --recompute selective --sequence-parallel \
    --schedule interleaved --virtual-stages 5

echo "== The cost model against the published Megatron-LM runs (SC21 Table 1)"
.venv/bin/python benchmarks/validate_published.py
