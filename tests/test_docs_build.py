"""The documentation builds with `mkdocs build --strict`: a broken link between pages, a page left
out of the nav, or an API reference block (`::: module.name`) naming a symbol that was renamed or
removed fails the build, and so this test."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
_TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name.split(".")[0]) is None for name in _TOOLS),
    reason="mkdocs, mkdocs-material or mkdocstrings[python] is not installed (the dev extra installs them)",
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
        timeout=240,
    )


@pytest.mark.slow
def test_the_docs_build_strictly(tmp_path: Path) -> None:
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in ("planner.api.search", "planner.api.estimate", "planner.api.SearchSettings"):
        assert f'id="{name}"' in api, name  # the reference is generated from the docstrings


@pytest.mark.parametrize(
    ("page", "said"),
    [
        ("::: planner.api.no_such_function\n", "Could not collect 'planner.api.no_such_function'"),
        ("See [the guide](no-such-page.md).\n", "no-such-page.md"),
    ],
    ids=["stale-reference", "broken-link"],
)
def test_a_stale_reference_or_a_broken_link_fails_the_build(tmp_path: Path, page: str, said: str) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# A page\n\n{page}")
    config |= {"docs_dir": str(docs), "nav": [{"Home": "index.md"}]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
