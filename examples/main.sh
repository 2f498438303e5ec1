#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: set up, search a plan, explain it, print its launch.
# The profiler and runtime issues extend this to profile the local CPU cluster and run the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
planner=.venv/bin/planner
out=out
mkdir -p "$out"

echo "== Search: Llama 3 70B on 8 DGX H100 nodes (64 GPUs), 512 x 8192 tokens per step"
"$planner" search --model llama3-70b --cluster dgx-h100:8 --global-batch-size 512 --seq-len 8192 \
    --top-k 5 --output "$out/plan.json"

echo "== Why the best plan won"
"$planner" explain "$out/plan.json"

echo "== How to launch it"
"$planner" launch "$out/plan.json" --master-addr node0.example

echo "== The cost model against the published Megatron-LM runs (SC21 Table 1)"
.venv/bin/python benchmarks/validate_published.py
