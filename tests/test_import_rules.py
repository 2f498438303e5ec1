"""The design's import rules, read from the code itself.

- The shared leaf (``planner.schemas``: types, errors, layout geometry) imports nothing else of ours.
- ``cost_models`` imports only the leaf (and itself), and nothing that does I/O or needs torch.
- ``runtime`` and ``profiler`` import no cost model and nothing of the front door but the leaf;
  the profiler uses the runtime only through its public API (``import runtime``).
- Nothing imports ``runtime`` or ``profiler`` but the run, profile and replan flows (the CLI and
  the API reach them through those).
- ``planner/files`` imports only the leaf (and itself): reading files never searches or prices.
- ``planner/flows`` never imports the CLI or the views; ``planner/views`` imports no flow, CLI or
  file reader (it renders result types).
- No file-level import circle anywhere in the product (found, not listed).
- The search never imports torch; importing the cost models, the API and the CLI does not drag it in.
"""

import ast
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"planner", "cost_models", "profiler", "runtime"}
LEAF = "planner.schemas"
FORBIDDEN_IN_COST_MODELS = {"torch", "os", "io", "pathlib", "subprocess", "socket", "open", "random", "time"}
RUNNING_FLOWS = {"planner/flows/run.py", "planner/flows/profile.py", "planner/flows/replan.py"}
PRODUCT = ("planner", "cost_models", "profiler", "runtime")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, with relative imports resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names += [module] if node.module else [f"{module}.{a.name}" for a in node.names]
    return names


def _ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def _offenders(folder: str, allowed: tuple[str, ...], forbidden: Collection[str] = ()) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in _imports(path):
            bad_ours = _ours(name) and not any(name == a or name.startswith(a + ".") for a in allowed)
            if bad_ours or name.split(".")[0] in forbidden:
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def test_the_leaf_imports_nothing_else_of_ours() -> None:
    assert not _offenders("planner/schemas", (LEAF,))


def test_cost_models_import_only_the_leaf_and_no_io_or_torch() -> None:
    assert not _offenders("cost_models", ("cost_models", LEAF), FORBIDDEN_IN_COST_MODELS)


def test_the_runtime_imports_only_the_leaf() -> None:
    assert not _offenders("runtime", ("runtime", LEAF))


def test_the_profiler_imports_only_the_leaf_and_the_runtimes_public_api() -> None:
    offenders = _offenders("profiler", ("profiler", LEAF, "runtime"))
    deep = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "profiler").rglob("*.py"))
        for name in _imports(path)
        if name.startswith("runtime.")
    ]
    assert not offenders + deep


def test_only_the_running_flows_import_the_runtime_and_the_profiler() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder in ("planner", "cost_models")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in RUNNING_FLOWS
        for name in _imports(path)
        if name.split(".")[0] in {"runtime", "profiler"}
    ]
    assert not offenders


def test_files_import_only_the_leaf() -> None:
    assert not _offenders("planner/files", ("planner.files", LEAF))


def test_flows_never_import_the_cli_or_the_views() -> None:
    assert not [o for o in _offenders("planner/flows", ()) if _front(o.split(": ")[1])]


def test_views_import_no_flow_cli_or_file_reader() -> None:
    assert not [o for o in _offenders("planner/views", ()) if _front(o.split(": ")[1], "planner.files")]


def _front(name: str, *more: str) -> bool:
    """Whether module ``name`` is part of the CLI or the views (or of ``more``)."""
    return any(name == m or name.startswith(m + ".") for m in ("planner.cli", "planner.views", *more))


def _module_file(name: str) -> Path | None:
    """The product file that module ``name`` (or the module holding the name imported) is, if any."""
    parts = name.split(".")
    for end in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:end])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if end and candidate.is_file():
                return candidate
    return None


def _import_graph() -> dict[Path, set[Path]]:
    """Each product file and the product files it imports (a package's ``__init__`` only where the
    import names the package itself)."""
    files = [p for folder in PRODUCT for p in sorted((ROOT / folder).rglob("*.py"))]
    graph: dict[Path, set[Path]] = {}
    for path in files:
        targets = {_module_file(n) for n in _imports(path) if _ours(n)}
        graph[path] = {t for t in targets if t is not None and t != path}
    return graph


def _circles(graph: dict[Path, set[Path]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan), as relative paths."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[str]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(str(p.relative_to(ROOT)) for p in component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_file_level_import_circle_anywhere() -> None:
    assert _circles(_import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    a, b, c = (ROOT / "a.py", ROOT / "b.py", ROOT / "c.py")
    assert _circles({a: {b}, b: {c}, c: {a}}) == [["a.py", "b.py", "c.py"]]
    assert _circles({a: {b}, b: {c}, c: set()}) == []


def test_search_never_imports_torch() -> None:
    assert not [
        f"{path.name}: {name}"
        for path in sorted((ROOT / "planner" / "search_engine").glob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] == "torch"
    ]


def _printed(code: str) -> str:
    """What ``code`` prints, run by this Python in a fresh process (nothing imported yet)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.strip()


@pytest.mark.parametrize("module", ["planner.schemas", "cost_models.estimate", "planner.api", "planner.cli"])
def test_importing_does_not_drag_torch_in(module: str) -> None:
    assert _printed(f"import sys, {module}; print('torch' in sys.modules)") == "False"


def test_the_cli_loads_or_tools_only_when_a_refiner_solves() -> None:
    # OR-Tools' import loads pandas: 0.4 s that every planner process paid, a planner run rank among them
    code = (
        "import sys, planner.cli; print(sorted({'ortools', 'pandas'} & set(sys.modules))); "
        "from planner.schemas.settings import Budget; from planner.search_engine.refiner import cp_sat_solver; "
        "cp_sat_solver(Budget(), seed=0); print('ortools' in sys.modules)"
    )
    assert _printed(code).split() == ["[]", "True"]


def test_the_cli_loads_optuna_only_for_a_study_and_keeps_it_quiet() -> None:
    # optuna's import: 0.14 s every planner process paid; it resets its own logger to INFO, so the
    # CLI's wish (warnings only) is applied where the study is made
    code = (
        "import logging, sys, planner.cli; planner.cli._configure_logging(); print('optuna' in sys.modules); "
        "from planner.search_engine.optuna_import import optuna_module; optuna = optuna_module(); "
        "print(logging.getLogger('optuna').getEffectiveLevel() == logging.WARNING)"
    )
    assert _printed(code).split() == ["False", "True"]


def test_importing_the_leaf_loads_nothing_else_of_ours() -> None:
    code = (
        "import sys, planner.schemas; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'planner', 'cost_models', 'profiler', 'runtime'}"
        " and not m.startswith('planner.schemas') and m != 'planner'))"
    )
    assert _printed(code) == "[]"


NEEDS_TORCH = {"torch", "runtime", "profiler"}
"""Top-level packages whose import needs torch (``runtime/__init__`` and the profiler import it)."""
PLANNING_ENTRIES = ("planner/__init__.py", "planner/api.py", "planner/cli/__init__.py", "planner/__main__.py")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(path: Path) -> list[str]:
    """The modules ``path`` imports when it is imported: not those inside functions (run on call)
    nor under ``if TYPE_CHECKING`` (never run)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                module = ".".join(part for part in (base, node.module or "") if part)
                names.extend([module] if node.module else [f"{module}.{a.name}" for a in node.names])
            elif isinstance(node, ast.If):
                visit(node.orelse if _is_type_checking(node.test) else node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif isinstance(node, ast.With | ast.ClassDef | ast.For | ast.While):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return names


def _import_time_closure(entries: Collection[Path]) -> tuple[set[Path], set[str]]:
    """The product files importing ``entries`` runs (with their packages' ``__init__``), and the
    top-level names of everything else they import."""
    seen: set[Path] = set()
    others: set[str] = set()
    todo = list(entries)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += [p / "__init__.py" for p in path.parents if p != ROOT and (p / "__init__.py").is_file()]
        for name in _import_time_imports(path):
            target = _module_file(name) if _ours(name) else None
            if target is not None:
                todo.append(target)
            elif not _ours(name):
                others.add(name.split(".")[0])
    return seen, others


def test_planning_import_closure_holds_no_torch() -> None:
    """Importing the API or the CLI runs no file that needs torch, whether torch is installed or not
    (``test_without_torch.py`` runs the commands themselves with torch unimportable)."""
    files, others = _import_time_closure([ROOT / entry for entry in PLANNING_ENTRIES])
    reached = {str(p.relative_to(ROOT)) for p in files}
    assert "planner/flows/search.py" in reached  # the closure follows our imports
    assert not {name for name in reached if name.split("/")[0] in NEEDS_TORCH}
    assert not {"torch", "optuna", "ortools"} & others  # the solvers: where a study or a model is made
    assert {"numpy", "typer", "pydantic"} <= others  # and records the others'


def test_torch_is_imported_only_after_require_torch() -> None:
    """In the front door, every function that imports torch, the runtime or the profiler first calls
    ``planner.flows.extras.require_torch``: the one place that turns a missing torch into one line
    naming the extra."""
    unguarded = []
    for path in sorted((ROOT / "planner").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            guards = [
                node.lineno
                for node in ast.walk(function)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require_torch"
            ]
            for node in ast.walk(function):
                modules = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(m.split(".")[0] in NEEDS_TORCH for m in modules) and not any(g < node.lineno for g in guards):
                    unguarded.append(f"{path.relative_to(ROOT)}:{node.lineno} in {function.name}")
    assert unguarded == []
