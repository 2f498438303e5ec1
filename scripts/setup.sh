#!/usr/bin/env bash
# Creates .venv and installs the project with its test tools. Idempotent.
# torch first, pinned to the CPU build where no torch is present: an unpinned torch would pull
# a multi-GB CUDA build. A machine that already has a torch (CPU or CUDA) keeps it; the dev extra
# pulls the runtime extra, whose range (pyproject.toml) pip then checks it against. Last, the
# exports extra (the frameworks the exports target, for the export tests) without its dependencies,
# so that it can neither replace torch nor pull CUDA wheels (pyproject.toml says why each is safe to
# skip); DeepSpeed ships only a source archive, built against the installed torch with no ops.
# Says on stderr what each of its 5 steps installs and how long the setup has taken (one line a
# step; pip itself stays quiet), and every 15 s of a long pip install that it is still at it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
step() { printf 'setup [%s/5] %s (%ss so far)\n' "$1" "$2" "$((SECONDS - start))" >&2; }
HEARTBEAT_S=15
# Runs "${@:3}" with a line on stderr every HEARTBEAT_S seconds while it runs ("$1": the step,
# "$2": what it installs), so a quiet pip is not taken for a hung one. The heartbeat also stops
# by itself once this script is gone (interrupted: a background job ignores the Ctrl-C).
with_heartbeat() {
    local n=$1 what=$2 beat rc=0
    shift 2
    (while sleep "$HEARTBEAT_S" && kill -0 "$$" 2>/dev/null; do step "$n" "still installing $what"; done) &
    beat=$!
    "$@" || rc=$?
    kill "$beat" 2>/dev/null || true
    wait "$beat" 2>/dev/null || true
    return "$rc"
}

if [ -x .venv/bin/python ]; then
    step 1 ".venv exists: $(.venv/bin/python --version)"
else
    step 1 "creating .venv with $("$PY" --version 2>&1) ($PY)"
    "$PY" -m venv .venv
fi
step 2 "upgrading pip in .venv"
.venv/bin/python -m pip install --quiet --upgrade pip
if torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null); then
    step 3 "torch $torch_version already in .venv: kept"
else
    step 3 "installing torch==2.13.0 (a large download: the longest step)"
    with_heartbeat 3 "torch" .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
deps=$(.venv/bin/python - <<'EOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
# dev pulls the runtime and fp8 extras by name (planner[runtime], planner[fp8]): show their
# packages, torch already said (torchao declares no dependency: it keeps the torch installed).
dev = [r for r in extras["dev"] if not r.startswith("planner[")] + extras["fp8"]
names = lambda reqs: ", ".join(re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] for r in reqs if not r.startswith("torch"))
print(f"{names(project['dependencies'])}; test tools: {names(dev)}")
EOF
)
step 4 "installing the project (editable) and what it needs: $deps"
with_heartbeat 4 "the project" .venv/bin/python -m pip install --quiet -e ".[dev]"
exports=$(.venv/bin/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["exports"]))')
step 5 "installing the export targets' config code, without dependencies: $exports"
# DS_BUILD_OPS=0: no C++/CUDA op is compiled at install (DeepSpeed builds them at first use);
# --no-build-isolation: its setup.py imports the installed torch, not one pip would fetch for the build.
with_heartbeat 5 "the export targets" env DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet --no-deps \
    --no-build-isolation $exports
printf 'setup done in %ss: .venv/bin/planner --help; .venv/bin/python -m pytest\n' "$((SECONDS - start))" >&2
