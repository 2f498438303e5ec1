#!/usr/bin/env bash
# Re-planning after a failure (issue 18): 4 CPU ranks train tiny-gpt with a checkpoint after
# every step under --elastic; one rank dies at the start of step 5 (the runtime's fault
# injection); the same command started on the 3 survivors (what an elastic restart with fewer
# ranks amounts to: examples/elastic_restart.sh does it with torchrun's agents) re-plans the same
# model and global batch for them by itself and resumes from the checkpoint, resharded. Prints the loss curve beside an uninterrupted 4-rank run's and the
# time from the failed job's end to the first new step.
# Environment: PYTHON (default .venv/bin/python), OUT (default out/replan).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-out/replan}
mkdir -p "$out"
quiet() { grep -v -e Warning -e "return func" -e "^W1" -e "^ *warnings.warn" >&2 || true; }
planner() { "$py" -m planner "$@"; }
torchrun() { "$py" -m torch.distributed.run --standalone --nproc-per-node "$1" -m planner "${@:2}"; }
STEPS=8
FAULT_STEP=5
LR=0.01

if [ ! -f "$out/cluster4.json" ]; then
    echo "== Profile this machine as a 4-rank cluster"
    torchrun 4 profile --output "$out/cluster4.json" --quick --model tiny-gpt --seq-len 128 --dtype fp32 2> >(quiet)
fi

echo "== Plan tiny-gpt, 12 x 128 tokens a step, fp32, on 4 ranks"
planner search -m tiny-gpt -c "$out/cluster4.json" --global-batch-size 12 --seq-len 128 --dtype fp32 --top-k 1 \
    --output "$out/plan4.json" | grep -e "│" -e wrote

echo "== Reference: the same plan, $STEPS steps, uninterrupted"
torchrun 4 run "$out/plan4.json" --steps "$STEPS" --lr "$LR" --report "$out/reference.json" >"$out/reference.log" 2>&1 \
    || { cat "$out/reference.log"; exit 1; }

echo "== Train with --elastic and a checkpoint after every step; rank 3 dies at the start of step $FAULT_STEP"
rm -rf "$out/ckpt"
elastic=(--elastic --checkpoint-dir "$out/ckpt" --checkpoint-every 1)
if torchrun 4 run "$out/plan4.json" --steps "$STEPS" --lr "$LR" "${elastic[@]}" \
    --inject-fault "3,$FAULT_STEP,exit" --timeout 30 >/dev/null 2>"$out/failed.log"; then
    echo "the faulty job did not fail" >&2
    exit 1
fi
failed_at=$(date +%s.%N)
grep -m1 "error:" "$out/failed.log" || true
echo "newest checkpoint: $(cat "$out/ckpt/latest")"

echo "== The same command on the 3 survivors: it re-plans for them (the plan's profile cut to 3 devices) and resumes"
torchrun 3 run "$out/plan4.json" --steps "$STEPS" --lr "$LR" "${elastic[@]}" \
    --report "$out/resumed.json" 2>"$out/resumed.log" >/dev/null || { cat "$out/resumed.log"; exit 1; }
grep -A12 "re-planned for" "$out/resumed.log" | grep -v -e Warning -e "return func" -e "^W1"
first_step_at=$(grep -m1 "the first after the resume" "$out/resumed.log" | sed 's/.*ended at //')

"$py" examples/loss_curve_after_restart.py "$out/reference.json" "$out/resumed.json" resumed \
    "$failed_at" "$first_step_at" "failed job's end -> first new step done (launch, re-plan, resume and the step)"
