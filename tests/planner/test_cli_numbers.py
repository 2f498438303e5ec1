"""Every float option of every command refuses NaN and infinity by name, in one line, exit 2.

typer's own ``min``/``max`` check refused NaN as out of range ("should be less than or equal to
0.9"), which never says what is wrong with the value; the options use ``checks.in_range``."""

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from planner.cli import app


def _float_options() -> list[tuple[str, str]]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    found = []
    for name, command in sorted(group.commands.items()):
        for param in command.params:
            annotation = param.type_descriptor.annotation if isinstance(param, TyperOption) else None
            if annotation in (float, float | None):
                found.append((name, max(param.opts, key=len)))
    return found


FLOAT_OPTIONS = _float_options()


def test_the_commands_have_float_options() -> None:
    assert {("search", "--memory-margin"), ("replan", "--memory-margin"), ("run", "--lr")} <= set(FLOAT_OPTIONS)


@pytest.mark.parametrize(("command", "option"), FLOAT_OPTIONS)
@pytest.mark.parametrize(("value", "said"), [("nan", "nan is not a number"), ("-inf", "-inf is not a finite number")])
def test_nan_and_infinity_are_named(command: str, option: str, value: str, said: str) -> None:
    result = CliRunner().invoke(app, [command, option, value])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "give a" in result.output


def test_a_value_out_of_range_says_the_range() -> None:
    result = CliRunner().invoke(app, ["search", "--memory-margin", "0.95"])
    assert result.exit_code == 2
    assert "0.95 is out of range; give a number >= 0 and <= 0.9" in result.output
