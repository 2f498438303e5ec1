"""The output checks run before any work refuse, each in one line with its fix, a path that cannot
be written: a folder given for a file, a missing folder, and a folder on the path that is a file."""

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from planner.cli.checks import check_output, check_plot_dir, check_plot_file
from planner.schemas.errors import SchemaError


def test_a_file_on_the_output_path_is_named_as_the_cause(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    checks: list[tuple[Callable[[Path], None], Path]] = [
        (partial(check_output, "--output"), tmp_path / "notes.txt" / "plan.json"),
        (partial(check_output, "--output"), tmp_path / "notes.txt" / "deeper" / "plan.json"),
        (check_plot_file, tmp_path / "notes.txt" / "search.png"),
        (check_plot_dir, tmp_path / "notes.txt" / "plots"),
    ]
    for check, path in checks:
        with pytest.raises(SchemaError, match=r"notes.txt' is a file, not a folder; give a path in a folder"):
            check(path)


def test_a_missing_folder_and_a_folder_for_a_file_keep_their_own_fixes(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="does not exist; create it first"):
        check_output("--output", tmp_path / "missing" / "plan.json")
    with pytest.raises(SchemaError, match="is a folder; give a file in it"):
        check_output("--output", tmp_path)
    check_output("--output", tmp_path / "plan.json")
