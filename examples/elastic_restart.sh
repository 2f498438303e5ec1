#!/usr/bin/env bash
# An elastic restart with torchrun (issue 18): two torchrun agents on this machine pose as two
# nodes of 2 CPU ranks each (a c10d rendezvous on localhost), running the lines `planner launch
# --elastic 1:2` writes. Once the step-4 checkpoint is complete, node 1's agent and its workers
# are killed; node 0's workers stop (a peer died), its agent restarts them in a world of 2, and
# `planner run --elastic` re-plans the same global batch for those 2 ranks and resumes the
# checkpoint, resharded, with no person in the loop. Prints the loss curve beside an uninterrupted
# 4-rank run's and the time from the kill to the first new step.
# Environment: PYTHON (default .venv/bin/python), OUT (default out/elastic), PORT (default 29611),
# LAST_CALL_S (default 10; torchrun's own is 30): how long a rendezvous that has its minimum of
# nodes waits for more before it starts: node 1 must join node 0 within it, and node 0's restart
# waits that long for node 1, which died.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-out/elastic}
port=${PORT:-29611}
mkdir -p "$out"
export PATH="$(dirname "$py"):$PATH"  # the launch lines call torchrun
quiet() { grep -v -e Warning -e "return func" -e "^W1" -e "^ *warnings.warn" >&2 || true; }
planner() { "$py" -m planner "$@"; }
STEPS=12
KILL_AFTER=4
LR=0.01

if [ ! -f "$out/cluster.json" ]; then
    echo "== Profile this machine as 2 nodes of 2 ranks (the profiler's simulated nodes)"
    "$py" -m torch.distributed.run --standalone --nproc-per-node 4 -m planner profile --output "$out/cluster.json" \
        --quick --model tiny-gpt --seq-len 128 --dtype fp32 --simulate-nodes 2 2> >(quiet)
fi

echo "== Plan tiny-gpt, 12 x 128 tokens a step, fp32, on the 2 x 2 ranks"
planner search -m tiny-gpt -c "$out/cluster.json" --global-batch-size 12 --seq-len 128 --dtype fp32 --top-k 1 \
    --output "$out/plan.json" | grep -e "│" -e wrote

echo "== Reference: the same plan, $STEPS steps, uninterrupted, 4 ranks"
"$py" -m torch.distributed.run --standalone --nproc-per-node 4 -m planner run "$out/plan.json" --steps "$STEPS" \
    --lr "$LR" --report "$out/reference.json" >"$out/reference.log" 2>&1 || { cat "$out/reference.log"; exit 1; }

echo "== The elastic launch: 1 to 2 nodes, a checkpoint after every step"
rm -rf "$out/ckpt"
planner launch "$out/plan.json" --elastic 1:2 --max-restarts 1 --checkpoint-dir "$out/ckpt" --steps "$STEPS" \
    --master-addr localhost --master-port "$port" --report "$out/elastic.json" --output "$out/launch.sh" \
    --last-call "${LAST_CALL_S:-10}"
sed -i "s/--steps $STEPS/--steps $STEPS --lr $LR/" "$out/launch.sh"  # the reference's learning rate
grep torchrun "$out/launch.sh" | head -1

if [ -n "$(ss -ltnH "sport = :$port")" ]; then
    echo "port $port is in use; set PORT to a free one" >&2
    exit 1
fi
tree() { for child in $(ps -o pid= --ppid "$1"); do tree "$child"; done; echo "$1"; }
listener() { ss -ltnpH "sport = :$port" | grep -o "pid=[0-9]*" | head -1 | cut -d= -f2; }
# Both agents name localhost as the rendezvous host, and the first to listen hosts its store: start
# node 0 and wait until it listens, so that node 1, the one killed, is not the store's host.
setsid bash "$out/launch.sh" 0 >"$out/node0.log" 2>&1 &
node0=$!
until tree "$node0" | grep -qx "$(listener)"; do
    kill -0 "$node0" 2>/dev/null || { echo "node 0 ended early" >&2; tail "$out/node0.log" >&2; exit 1; }
    sleep 0.05
done
setsid bash "$out/launch.sh" 1 >"$out/node1.log" 2>&1 &
node1=$!
until [ "$(cat "$out/ckpt/latest" 2>/dev/null)" = "step-$(printf %08d $KILL_AFTER)" ]; do
    kill -0 "$node0" 2>/dev/null || { echo "node 0 ended early" >&2; tail "$out/node0.log" >&2; exit 1; }
    sleep 0.1
done
echo "== Step $KILL_AFTER is checkpointed: kill node 1 (its agent and workers)"
kill -9 $(tree "$node1")
killed_at=$(date +%s.%N)
log="$out/node0.log"
wait "$node0" || { echo "node 0 failed" >&2; tail -30 "$log" >&2; exit 1; }
grep -m1 "^error: training stopped" "$log" || true
grep -A12 "re-planned for" "$log" | grep -v -e Warning -e "return func" -e "^W1"
first_step_at=$(grep -m1 "the first after the resume" "$log" | sed 's/.*ended at //')

"$py" examples/loss_curve_after_restart.py "$out/reference.json" "$out/elastic.json" restarted \
    "$killed_at" "$first_step_at" "node 1 killed -> first new step done"
