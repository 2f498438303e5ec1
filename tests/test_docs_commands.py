"""Every command the documentation shows is a real one: each planner line (also under torchrun)
parses under the CLI as it stands, options and values, and each torchrun line under torchrun's own
parser; the user guide shows every step on both clusters, and its Python example runs. A renamed
option or a removed value fails here before a reader meets it."""

import contextlib
import io
from pathlib import Path

import pytest
import typer.main
from docs_blocks import LOCAL_TITLE, ROOT, blocks, planner_args, shell_commands
from typer.core import TyperGroup

from planner.cli import app

GUIDE = ROOT / "docs" / "guide.md"


def _parse_error(args: list[str]) -> str | None:
    """Why the CLI would refuse ``planner ARGS`` before running it, or None if it parses."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    name, *rest = args
    if name not in group.commands:
        return f"no command {name!r}"
    try:
        group.commands[name].make_context(name, rest).close()
    except Exception as e:  # click's usage errors; typer vendors click, so no public class names them
        if not hasattr(e, "format_message"):
            raise
        return str(e.format_message())
    return None


def test_the_docs_show_planner_commands() -> None:
    lines = [c for _, c in shell_commands() if planner_args(c.argv) is not None]
    assert len(lines) > 60  # every page's examples are found (a fence the reader missed drops them)


def test_every_planner_command_in_the_docs_parses() -> None:
    refused = []
    for block, command in shell_commands():
        split = planner_args(command.argv)
        if split is not None and (error := _parse_error(split[1])) is not None:
            refused.append(f"{block.page.relative_to(ROOT)}: {command.line}\n    {error}")
    assert not refused, "\n".join(refused)


def test_the_checker_refuses_a_misspelt_option() -> None:
    assert _parse_error(["search", "--model", "tiny-gpt", "--topk", "3"]) is not None
    assert _parse_error(["export", "plan.json", "--to", "nemo"]) is not None
    assert _parse_error(["export", "plan.json", "--to", "megatron"]) is None


def test_every_torchrun_line_in_the_docs_parses() -> None:
    run = pytest.importorskip("torch.distributed.run", reason="torchrun's parser comes with torch (runtime extra)")
    parser = run.get_args_parser()
    checked = 0
    for block, command in shell_commands():
        split = planner_args(command.argv)
        if split is None or Path(command.argv[0]).name != "torchrun":
            continue
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                parsed = parser.parse_args([*split[0], "-m", "planner", *split[1]])
            except SystemExit:
                pytest.fail(f"{block.page.relative_to(ROOT)}: {command.line}\n{err.getvalue()}")
        assert parsed.module and parsed.training_script == "planner", command.line
        checked += 1
    assert checked >= 8


def test_the_guide_shows_every_step_on_both_clusters() -> None:
    shown = [b for b in blocks(GUIDE) if b.language == "bash"]
    local = [b for b in shown if b.title == LOCAL_TITLE]
    gpu = [b for b in shown if b.title == "GPU cluster"]
    assert len(local) == len(gpu) >= 7 and len(local) + len(gpu) == len(shown)
    for name in ("profile", "search", "estimate", "explain", "export", "launch", "run", "tune", "validate"):
        for cluster in (local, gpu):
            assert any(name in b.text for b in cluster), name


def test_the_guide_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (example,) = [b for b in blocks(GUIDE) if b.language == "python"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example.text, str(GUIDE), "exec"), {"__name__": "guide"})
    assert "--tensor-model-parallel-size" in printed.getvalue()
    assert (tmp_path / "plan.json").is_file()
