#!/usr/bin/env bash
# Builds .venv-torch211 (torch 2.11.0, the oldest release the runtime supports, beside the
# project's other dependencies) and runs the tests marked torch_oldest in it; extra arguments go
# to pytest. The project is not installed there (its pin names the newest torch): the tests run
# from the source tree on PYTHONPATH, as on a cluster whose torch came with its CUDA stack.
# PyPI's torch 2.11.0 is the CUDA build: about 2.6 GB with its nvidia libraries (it runs on CPU
# too), which is why CI does not build this venv and tests/test_torch_oldest.py skips without it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-torch211
start=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
    printf 'torch-oldest: creating %s with %s\n' "$VENV" "$("$PY" --version 2>&1)" >&2
    "$PY" -m venv "$VENV.partial"
    deps=$("$VENV.partial/bin/python" - <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = ("pytest", "pytest-timeout", "pytest-xdist", "hypothesis")
dev = [r for r in project["optional-dependencies"]["dev"] if r.startswith(wanted)]
print(" ".join(r for r in project["dependencies"] + dev if not r.startswith("torch")))
EOF
)
    printf 'torch-oldest: installing torch==2.11.0 and %s (the torch download is the long part)\n' "$deps" >&2
    # shellcheck disable=SC2086  # deps is a list of requirements, split on purpose
    "$VENV.partial/bin/python" -m pip install --quiet "torch==2.11.0" $deps
    mv "$VENV.partial" "$VENV"
    printf 'torch-oldest: %s built in %ss\n' "$VENV" "$((SECONDS - start))" >&2
fi
# the test tools' list has grown since some venvs were built (pytest-xdist: the suite's -n auto)
"$VENV/bin/python" -c "import xdist" 2>/dev/null || "$VENV/bin/python" -m pip install --quiet "pytest-xdist>=3.6"
PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m torch_oldest tests "$@"
