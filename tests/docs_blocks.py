"""The shell commands the documentation shows, read from its fenced code blocks, for the tests
that parse them against the CLI and run the user guide's local ones."""

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
LOCAL_TITLE = "Local CPU cluster"
"""The title of the user guide's blocks that run on this machine; the guide's test runs them."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    language: str
    title: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One command line of a shell block, continuation lines joined, comments dropped."""

    line: str
    env: dict[str, str]
    argv: list[str]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, dedented (content tabs indent theirs)."""
    found = []
    for match in _FENCE.finditer(page.read_text()):
        info = match["info"].strip()
        language = info.split(" ", 1)[0]
        title = re.search(r'title="([^"]*)"', info)
        text = textwrap.dedent(match["indent"] + match["body"].replace("\n" + match["indent"], "\n"))
        found.append(Block(page=page, language=language, title=title[1] if title else "", text=text))
    return found


def commands(block: Block) -> list[Command]:
    """The block's command lines, each split as bash would (leading VAR=value kept apart)."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in joined.splitlines():
        argv = shlex.split(line, comments=True)
        env = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
            name, value = argv.pop(0).split("=", 1)
            env[name] = value
        if argv:
            out.append(Command(line=line.split(" #", 1)[0].strip(), env=env, argv=argv))
    return out


def planner_args(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(the launcher's own arguments, planner's arguments) of a line that runs planner: ``planner
    ARGS``, ``torchrun T -m planner ARGS`` or ``python -m planner ARGS``; None for any other line."""
    program = Path(argv[0]).name
    if program == "planner":
        return [], argv[1:]
    if program in ("torchrun", "python", "python3") and "-m" in argv:
        at = argv.index("-m")
        if argv[at + 1 : at + 2] == ["planner"]:
            return argv[1:at], argv[at + 2 :]
    return None


def shell_commands() -> list[tuple[Block, Command]]:
    """Every command line of every bash block of every page."""
    return [(b, c) for page in PAGES for b in blocks(page) if b.language == "bash" for c in commands(b)]
