"""Every fix a refusal suggests names options the command it names really has: "search with
--X" an option of `planner search`, "estimate with/without --X" one of `planner estimate`, and
"plan with --X" one both have (a user plans with either). A torchtitan refusal once said "plan
with --sequence-parallel", an option search does not have.

The fixes are read from the source of the modules that refuse plans (the exports, the runtime's
checks, the flows), so that a new refusal is checked without a test of its own."""

import re
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from planner.cli import app

ROOT = Path(__file__).resolve().parents[2]
REFUSING = [*sorted((ROOT / "planner" / "export").glob("*.py")), ROOT / "planner/schemas/runtime_support.py"]
FIX = re.compile(r"\b(plan|search|estimate) (?:with|without) ((?:--[a-z0-9-]+[^,;\"]*?)+)(?=[,;\"]|$)")


def _options(command: str) -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return {opt for param in group.commands[command].params for opt in (*param.opts, *param.secondary_opts)}


def _fixes() -> list[tuple[str, str, str]]:
    found = []
    for path in REFUSING:
        text = re.sub(r'"\s*\n\s*f?"', "", path.read_text())  # implicit string concatenation as one string
        for verb, rest in FIX.findall(text):
            found += [(path.name, verb, option) for option in re.findall(r"--[a-z0-9-]+", rest)]
    return found


FIXES = _fixes()


def test_the_refusals_suggest_fixes() -> None:
    names = {(verb, option) for _, verb, option in FIXES}
    assert {("estimate", "--sequence-parallel"), ("search", "--no-hierarchical-sharding")} <= names


@pytest.mark.parametrize(("module", "verb", "option"), FIXES)
def test_a_suggested_option_is_one_the_command_has(module: str, verb: str, option: str) -> None:
    commands = ["search", "estimate"] if verb == "plan" else [verb]
    for command in commands:
        assert option in _options(command), f"{module} suggests `{verb} with {option}`; planner {command} lacks it"
