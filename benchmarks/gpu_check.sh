#!/usr/bin/env bash
# The one-GPU check: the profiler, the runtime and the planner's predictions on one CUDA device,
# as one command (under 8 minutes on an H100), writing JSON, a log and a PNG under $OUT.
#
#   bash benchmarks/gpu_check.sh          on the GPU machine (the wheels it lacks carried in .whl/,
#                                         made here by scripts/gpu_wheels.sh)
#   bash benchmarks/gpu_check.sh --cpu    every step on this machine's CPU, with tiny models (the
#                                         test suite runs it, so the script cannot rot)
#
# Steps, each capped by `timeout` and logged: the environment; the tests marked gpu; a one-rank
# `planner profile`; its figures beside the dgx-h100 preset's; the profile kept as a fixture with
# its date, torch and driver; then per case (a dense model without and with recompute, an MoE)
# `planner search` on the measured profile, a dry run, and `planner run` under torchrun; on a GPU,
# a plan offloading half its optimizer states and 4 layers' activations, estimated and run; last,
# the measured step time and memory beside the estimates (compare.json, compare.png). A failed
# step is named (`!! rc=`) and the others still run; the script exits 1 if any failed.
# What one GPU cannot show (NCCL between GPUs, links, collectives, pipelines, tensor and expert
# parallelism across devices) is not faked: the profile says which phases it skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=gpu
[ "${1:-}" = "--cpu" ] && mode=cpu
export OUT=${OUT:-out/gpu-check-$mode} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1

if [ "$mode" = cpu ]; then
    PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
    dense=tiny-gpt moe=tiny-moe seq=64 batch=8 dtype=fp32 steps=4  # CPU GEMMs in bf16 are slow
    # One micro-batch size for every case, so that recompute's saving shows in the predicted bytes
    # (the search's fastest micro-batch, read off a profile timed on shared cores, varies by case).
    pinned=(--micro-batch-size 2)
    # The layers timed at that micro-batch only, 3 times each (the GPU run times 1, 2, 4 and 8, 7
    # times each): the one-rank profile alone 10.0 -> 7.8 s on the 2-core machine.
    layer_timings=(--layer-micro-batches 2 --layer-repeats 3)
else
    PY=${PYTHON:-python3}
    pinned=()  # the search chooses the micro-batch
    layer_timings=()
    dense=benchmarks/data/gpu_check_dense.yaml moe=benchmarks/data/gpu_check_moe.yaml
    seq=2048 batch=16 dtype=bf16 steps=8
    if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import ortools, optuna, pydantic" 2>/dev/null; then
        site=$(mktemp -d)  # the machine reaches no package index: the carried wheels, without their deps
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
        export PYTHONPATH=$site:$PYTHONPATH
    fi
fi
run="$PY -m torch.distributed.run --standalone --nproc-per-node 1"
failed=()
step() {  # step SECONDS NAME COMMAND...: run it capped, say how it ended
    local cap=$1 name=$2
    shift 2
    echo "== $(date +%T) $name: $*"
    timeout --kill-after 10 "$cap" "$@"
    local rc=$?
    [ $rc = 0 ] || { echo "!! rc=$rc: $name"; failed+=("$name"); }
    return $rc
}

step 60 env "$PY" benchmarks/gpu_check.py env
if [ "$mode" = gpu ]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    step 240 gpu-tests "$PY" -m pytest -m gpu -q -p no:cacheprovider -o addopts= --continue-on-collection-errors --junitxml "$OUT/gpu_tests.xml" tests
else
    echo "== gpu-tests: not here (the suite runs them, and they skip without CUDA)"
fi
step 200 profile $run -m planner profile --model "$dense" --seq-len "$seq" --dtype "$dtype" --quick \
    --fp8 tensorwise ${layer_timings[@]+"${layer_timings[@]}"} --output "$OUT/profile.json"
step 30 preset "$PY" benchmarks/gpu_check.py preset "$OUT/preset-h100x1.json"
cluster="$OUT/profile.json"
if [ -f "$cluster" ]; then
    step 30 versus-preset "$PY" benchmarks/gpu_check.py versus-preset "$cluster" "$OUT/preset-h100x1.json"
    step 30 fixture "$PY" benchmarks/gpu_check.py fixture "$cluster" "$OUT/$mode-profile.json"
else
    echo "!! no measured profile: the cases are priced on the preset"
    cluster="$OUT/preset-h100x1.json"
fi
[ "$mode" = cpu ] && cluster="$OUT/profile.json"  # the preset's H100 memory would not bound a CPU rank

plans=()
case_() {  # case_ NAME MODEL RECOMPUTE
    local name=$1 model=$2 recompute=$3 plan="$OUT/$1.json"
    step 60 "search $name" "$PY" -m planner search --model "$model" --cluster "$cluster" --global-batch-size "$batch" \
        --seq-len "$seq" --dtype "$dtype" --dp 1 --tp 1 --pp 1 --recompute "$recompute" ${pinned[@]+"${pinned[@]}"} --top-k 1 \
        --output "$plan" ||
        return
    plans+=("$plan")
    step 90 "dry run $name" "$PY" benchmarks/gpu_check.py dry "$plan"
    step 150 "run $name" $run -m planner run "$plan" --steps "$steps" --warmup-steps 2 --report "$OUT/report_$name.json"
}
case_ dense "$dense" none
case_ dense-rc "$dense" full
case_ moe "$moe" none
if [ "$mode" = gpu ]; then  # the offloads copy from a GPU only (a CPU's host is its device memory)
    plan="$OUT/offload.json"  # half the optimizer states and 4 layers' activations on the host
    step 60 "estimate offload" "$PY" -m planner estimate --model "$dense" --cluster "$cluster" \
        --global-batch-size "$batch" --seq-len "$seq" --dtype "$dtype" --dp 1 --tp 1 --pp 1 --micro-batch-size 4 \
        --zero-stage 1 --optimizer-offload 0.5 --activation-offload 4 --output "$plan" &&
        plans+=("$plan") &&
        step 150 "run offload" $run -m planner run "$plan" --steps "$steps" --warmup-steps 2 \
            --report "$OUT/report_offload.json"
fi
[ ${#plans[@]} -gt 0 ] && step 60 compare "$PY" benchmarks/gpu_check.py compare "${plans[@]}" --preset "$OUT/preset-h100x1.json"

if [ ${#failed[@]} -gt 0 ]; then
    printf '!! failed steps: %s\n' "${failed[*]}"
    exit 1
fi
echo "== all steps passed ($mode); results in $OUT"
