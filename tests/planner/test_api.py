"""The Python API's front door: one name, one meaning (``planner.search`` and ``planner.tune`` are
the functions whatever was imported before), every exported function documented with its
arguments, returns and errors, and the functions that need torchrun say so without starting."""

import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner import api
from planner.schemas import TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.settings import SearchSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "first",
    ["", "import planner.search_engine", "import planner.tuning.tuner", "import planner.cli", "import planner.api"],
)
def test_planner_search_and_tune_are_the_functions_whatever_was_imported_first(first: str) -> None:
    code = (
        f"{first}\nimport planner\nfrom planner.schemas import TrainingSpec\n"
        "training = TrainingSpec(global_batch_size=16, seq_len=64)\n"
        "plans = planner.search('tiny-gpt', 'dgx-a100-80g:1', training, planner.SearchSettings(top_k=2))\n"
        "print(type(plans).__name__, len(plans), type(plans[0]).__name__)\n"
        "print(*(getattr(planner, n).__module__ for n in ('search', 'tune', 'validate', 'run', 'profile')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    modules = "planner.flows.search planner.flows.tune planner.flows.tune planner.flows.run planner.flows.profile"
    assert out.stdout.splitlines() == ["tuple 2 Plan", modules]


def test_planner_search_is_the_function_before_and_after_an_estimate() -> None:
    # Once ``planner.search`` was the function on first access and the search
    # subpackage after ``planner.estimate`` had imported it (a subpackage import sets the attribute).
    code = (
        "import planner\nfrom planner.schemas import Layout, TrainingSpec\n"
        "print(type(planner.search).__name__)\n"
        "training = TrainingSpec(global_batch_size=16, seq_len=64)\n"
        "layout = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, "
        "micro_batch_size=2)\n"
        "planner.estimate('tiny-gpt', 'dgx-a100-80g:1', training, layout)\n"
        "print(type(planner.search).__name__, planner.search.__module__)\n"
        "planner.search('tiny-gpt', 'dgx-a100-80g:1', training, planner.SearchSettings(top_k=1))\n"
        "print(type(planner.search).__name__, type(planner.estimate).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.splitlines() == ["function", "function planner.flows.search", "function function"]


def test_no_subpackage_of_planner_shares_a_name_with_an_exported_function() -> None:
    submodules = {m.name for m in pkgutil.iter_modules(planner.__path__)}
    assert "search_engine" in submodules  # the search's home, named apart from planner.search
    assert not submodules & set(planner.__all__)


def test_a_strategy_given_by_name_is_that_strategy() -> None:
    # strategy="optuna" (a str, as the docstring allows) once reached the runner as
    # the string and failed with AttributeError: 'str' object has no attribute 'search'.
    training = TrainingSpec(global_batch_size=16, seq_len=64)
    budget = api.Budget(max_trials=12)
    for name in ("optuna", "exhaustive"):
        outcome, plans = api.search_outcome(
            "tiny-gpt", "dgx-a100-80g:1", training, SearchSettings(strategy=name, budget=budget)
        )
        assert outcome.strategy == name and plans
    with pytest.raises(SchemaError, match=r"strategy 'annealing' is not one of: exhaustive, optuna"):
        api.search("tiny-gpt", "dgx-a100-80g:1", training, SearchSettings(strategy="annealing"))


def test_planner_api_is_reachable_after_import_planner() -> None:
    # The README points at planner.api; after `import planner` alone it was not an attribute yet.
    code = (
        "import planner\nfrom planner.schemas import TrainingSpec\n"
        "training = TrainingSpec(global_batch_size=16, seq_len=64)\n"
        "settings = planner.api.SearchSettings(strategy='optuna', top_k=1, budget=planner.api.Budget(max_trials=12))\n"
        "plans = planner.api.search('tiny-gpt', 'dgx-a100-80g:1', training, settings)\n"
        "print(len(plans), type(planner.search).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert out.stdout.splitlines() == ["1 function"], out.stderr


def test_every_exported_name_resolves() -> None:
    for name in planner.__all__:
        assert getattr(planner, name) is not None, name
    assert set(api.__all__) <= set(planner.__all__)


FUNCTIONS = [
    name
    for name in api.__all__
    if inspect.isfunction(getattr(api, name)) and getattr(api, name).__module__.startswith("planner.flows")
]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_api_function_documents_its_arguments_returns_and_errors(name: str) -> None:
    doc = inspect.getdoc(getattr(api, name)) or ""
    assert "Returns:" in doc and "Raises:" in doc, name
    if inspect.signature(getattr(api, name)).parameters:
        assert "Args:" in doc, name


@pytest.mark.parametrize("name", [n for n in api.__all__ if inspect.isfunction(getattr(api, n))])
def test_help_on_an_api_function_explains_each_argument_itself(name: str) -> None:
    """``help(planner.search)`` is read alone: each argument on its own line, none "as for" another."""
    doc = inspect.getdoc(getattr(api, name)) or ""
    assert "as for" not in doc, name
    for argument in inspect.signature(getattr(api, name)).parameters:
        assert re.search(rf"^    {argument}( \([^)]*\))?: \S", doc, re.MULTILINE), (name, argument)


def test_dir_of_the_package_lists_the_api() -> None:
    listed = dir(planner)
    assert set(planner.__all__) | {"api", "schemas"} <= set(listed) and listed == sorted(listed)


def test_run_outside_torchrun_says_how_to_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    plan = planner.search("tiny-gpt", "dgx-a100-80g:1", TrainingSpec(global_batch_size=16, seq_len=64))[0]
    api.save_plan(plan, tmp_path / "plan.json")
    loaded, sha256 = api.read_plan(tmp_path / "plan.json")
    settings = api.RunSettings(plan=loaded, plan_sha256=sha256, plan_file=tmp_path / "plan.json")
    with pytest.raises(SchemaError, match=r"`planner launch .*plan.json` prints the command"):
        planner.run(settings)


def test_importing_the_api_imports_neither_torch_nor_the_tuners_scipy() -> None:
    code = "import sys, planner.api; print('torch' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False False"
