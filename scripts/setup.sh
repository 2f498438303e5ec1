#!/usr/bin/env bash
# Creates .venv and installs the project with its test tools. Idempotent.
# torch first, pinned to the CPU build where no torch is present: an unpinned torch would pull
# a multi-GB CUDA build. A machine that already has torch 2.13 (CPU or CUDA) keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
