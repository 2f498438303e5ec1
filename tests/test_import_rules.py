"""The design's import rules: cost_models is pure (no torch, no I/O modules, only the schemas
of the planner), and importing the cost models does not drag torch in."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_OURS = ("cost_models", "planner.schemas", "planner.errors")
FORBIDDEN = {"torch", "os", "io", "pathlib", "subprocess", "socket", "open", "random", "time"}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_cost_models_import_only_schemas_and_stdlib_computation() -> None:
    offenders = []
    for path in sorted((ROOT / "cost_models").glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            ours = top in {"planner", "cost_models", "profiler", "runtime"}
            if (ours and not name.startswith(ALLOWED_OURS)) or top in FORBIDDEN:
                offenders.append(f"{path.name}: {name}")
    assert not offenders, offenders


def test_search_never_imports_torch() -> None:
    offenders = [
        f"{path.name}: {name}"
        for path in sorted((ROOT / "planner" / "search").glob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] == "torch"
    ]
    assert not offenders, offenders


def test_importing_the_cost_models_and_api_does_not_import_torch() -> None:
    code = "import sys, cost_models.estimate, planner.api, planner.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
