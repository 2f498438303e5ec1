#!/usr/bin/env bash
# Downloads into .whl/ the wheels the GPU machine lacks, for its Python 3.12 on manylinux x86_64,
# so that they travel there with the working tree (what travels stays under 64 MiB; this set is
# about 42 MB, torchao 3.4 of it). That machine reaches no package registry: it has CUDA torch 2.11, triton, pytest,
# numpy, scipy, pandas, rich, typer, matplotlib, pyyaml, hypothesis, absl-py, tqdm, jinja2 and
# MarkupSafe, but none of ortools, optuna, pydantic and torchao, their own dependencies, or pytest-timeout.
#
# The versions are pinned, each within what pyproject.toml admits and the ones the test suite runs
# with here, so the set is the same on every run; bump them together. --no-deps: the set is
# complete by hand (a resolver would fetch torch too). greenlet is left out: SQLAlchemy 2.1 needs
# it only for its asyncio extra, which optuna does not use.
# Checked by installing them as below into a CPython 3.12 that holds the machine's other
# packages (no torch): `planner search` ran, CP-SAT and Optuna included.
#
# On the GPU machine (as benchmarks/gpu_check.sh does), the project runs from the working tree:
#   python3 -m pip install --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
# (no `pip install -e .`: pip would resolve torch against pyproject's range with no index to read.)
#
# Usage: bash scripts/gpu_wheels.sh   (prints each wheel and the total; fails above 60 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WHEELS=(
    # ortools>=9.10 (pyproject) and what it imports; protobuf in ortools 9.15's range (>=6.33.1,<6.34)
    ortools==9.15.6755 immutabledict==4.3.1 protobuf==6.33.6
    # optuna>=4.0 and what it imports
    optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0
    # pydantic>=2.7 and what it imports; pydantic 2.14 wants typing-extensions>=4.16
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0
    # the suite's per-test time limit (pyproject's [tool.pytest.ini_options] timeout)
    pytest-timeout==2.4.0
    # the fp8 extra: the runtime's FP8 linear layers (declares no dependency; built for torch 2.11+)
    torchao==0.18.0
)
LIMIT_BYTES=$((60 * 1024 * 1024))

rm -rf .whl
mkdir -p .whl
"$PY" -m pip download --quiet --dest .whl --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_28_x86_64 \
    "${WHEELS[@]}"

count=$(find .whl -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
    echo "error: expected ${#WHEELS[@]} wheels in .whl/, found $count" >&2
    exit 1
fi
total_bytes=$(find .whl -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s}')
find .whl -type f -name '*.whl' -printf '%s\t%f\n' | sort -n | awk -F'\t' '{printf "%8.2f MiB  %s\n", $1 / 2^20, $2}'
awk -v b="$total_bytes" -v n="$count" 'BEGIN {printf "%d wheels, %.2f MiB (%.1f MB) in .whl/\n", n, b / 2^20, b / 1e6}'
if [ "$total_bytes" -gt "$LIMIT_BYTES" ]; then
    echo "error: the wheels take $((total_bytes / 1024 / 1024)) MiB, over the 60 MiB kept for them of the 64 MiB that travels" >&2
    exit 1
fi
