#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: set up; profile the local CPU "cluster" (4 gloo
# ranks); search a plan for a tiny model on what was measured; explain it; run it with `planner
# launch --run` (the line `planner launch` prints) and compare measured with predicted; tune (run
# several plans, calibrate the profile, report the model's errors); then plan a large model on a
# published cluster preset and check the cost model against the published Megatron-LM runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
planner=.venv/bin/planner
out=out
mkdir -p "$out"

echo "== Profile this machine as a 4-rank cluster (links, collectives, GEMMs, memory)"
.venv/bin/torchrun --standalone --nproc-per-node 4 -m planner profile --output "$out/cluster.json" --quick \
    --model tiny-gpt --seq-len 128 --dtype bf16 2> >(grep -v -e Warning -e "return func" -e "^W1" >&2)

echo "== Search: tiny-gpt on the measured cluster"
"$planner" search --model tiny-gpt --cluster "$out/cluster.json" --global-batch-size 32 --seq-len 128 \
    --top-k 5 --output "$out/plan.json"
"$planner" explain "$out/plan.json" --plot "$out/plots"

echo "== Run the plan for 6 steps: the torchrun line planner launch prints, run here by launch --run"
"$planner" launch "$out/plan.json" --steps 6 --report "$out/report.json"
"$planner" launch "$out/plan.json" --run --steps 6 --report "$out/report.json" \
    2> >(grep -v -e Warning -e "return func" -e "^W1" >&2)

echo "== Tune: run 4 plans for real, fit the profile's calibration, show the model's errors"
rm -f "$out/tune.db"
"$planner" tune --model tiny-gpt --cluster "$out/cluster.json" --global-batch-size 32 --seq-len 128 \
    --top-k 4 --steps 6 --storage "sqlite:///$out/tune.db" --workdir "$out/tune" --output "$out/tuned-plan.json"

echo "== Search: Llama 3 70B on 8 DGX H100 nodes (64 GPUs), 512 x 8192 tokens per step"
"$planner" search --model llama3-70b --cluster dgx-h100:8 --global-batch-size 512 --seq-len 8192 --top-k 5

echo "== The cost model against the published Megatron-LM runs (SC21 Table 1)"
.venv/bin/python benchmarks/validate_published.py
