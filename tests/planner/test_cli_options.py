"""The CLI's options are a contract: every command's option names, defaults, help texts and
whether they are hidden are frozen in tests/golden/cli_options.json (as torchtitan's
test_no_new_cli_options freezes its config), so that removing or renaming an option, or changing
what its help promises, is a decision and not an accident. Regenerate with --update-golden and say
why in the commit."""

import json
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from planner.cli import app

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cli_options.json"


def _options() -> dict[str, list[dict[str, Any]]]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    frozen = {}
    commands = {
        **group.commands,
        **{  # a group's commands (planner cluster cut) under their full names
            f"{name} {sub}": command
            for name, nested in group.commands.items()
            if isinstance(nested, TyperGroup)
            for sub, command in nested.commands.items()
        },
    }
    for name, command in sorted(commands.items()):
        frozen[name] = [
            {
                "name": param.name,
                "kind": param.param_type_name,
                "flags": sorted([*param.opts, *param.secondary_opts]),
                "default": None if param.default is None else str(param.default),
                "help": getattr(param, "help", None),
                "hidden": bool(getattr(param, "hidden", False)),
            }
            for param in command.params
        ]
    return frozen


def test_no_option_is_removed_or_changed_unnoticed(update_golden: bool) -> None:
    got = _options()
    if update_golden:
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        return
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want), "a command was added or removed"
    for command in want:
        assert {o["name"]: o for o in got[command]} == {o["name"]: o for o in want[command]}, command


def test_every_command_has_help_and_an_example_where_it_takes_inputs() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    for name, command in group.commands.items():
        assert command.help, name
        if name != "presets":
            assert "Example:" in command.help, name
