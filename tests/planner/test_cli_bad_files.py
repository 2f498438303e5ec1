"""Files that are not what a command takes end in one line naming the file, the cause and the fix
(exit 2), never a traceback: JSON or YAML nested deeper than Python's parsers recurse, read by
every command that reads a model, cluster profile or plan file."""

from pathlib import Path

import pytest
from harness import planner_main

BATCH = ["--global-batch-size", "16", "--seq-len", "128"]
DEEP = {"deep.json": "[" * 100_000 + "]" * 100_000, "deep.yaml": "a: " + "[" * 100_000}
NESTED_COMMANDS = {
    "estimate -m": ["estimate", "-m", "{f}", "-c", "dgx-h100:1", *BATCH, "--dp", "8"],
    "search -c": ["search", "-m", "tiny-gpt", "-c", "{f}", *BATCH],
    "estimate --plan": ["estimate", "--plan", "{f}"],
    "explain": ["explain", "{f}"],
    "export": ["export", "{f}", "--to", "torchtitan"],
    "launch": ["launch", "{f}"],
    "replan": ["replan", "{f}", "-c", "dgx-h100:1"],
    "run --dry-run": ["run", "--dry-run", "{f}"],
}


def one_line(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    code, out, err = planner_main(args, monkeypatch, cwd=tmp_path)
    assert code == 2 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1, out + err
    return err.strip()


@pytest.mark.parametrize("command", NESTED_COMMANDS)
def test_a_deeply_nested_file_is_one_line(command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = "deep.yaml" if command == "estimate -m" else "deep.json"
    (tmp_path / name).write_text(DEEP[name])
    line = one_line([a.replace("{f}", name) for a in NESTED_COMMANDS[command]], monkeypatch, tmp_path)
    assert line.startswith(f"error: {name}: nested too deeply to read (maximum recursion depth exceeded")
    assert line.endswith("give a planner file (a few levels deep)")
