"""An Optuna storage on a database server that cannot be used: `planner search`, `tune` and
`validate` say so in one line and exit 2, before any work, instead of Optuna's traceback.

The server here is a SQLAlchemy dialect whose connect fails as a driver's does when nothing
listens on the port (its DBAPI error, which SQLAlchemy wraps); a real driver, where one is
installed, is tried on a port nothing listens on."""

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness import planner_main
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import make_url

from planner import api
from planner.cli.checks import CONNECT_TIMEOUT_S, connect_args

TRAINING = ["-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"]
COMMANDS = {
    "search": ["search", *TRAINING, "--strategy", "optuna", "--trials", "3"],
    "tune": ["tune", *TRAINING, "--no-calibrate"],
    "validate": ["validate"],
}
REFUSED = "connection to server at 127.0.0.1, port 1 failed: Connection refused"


class RefusingServer(SQLiteDialect_pysqlite):
    """A dialect whose server refuses every connection, as a driver reports it."""

    def create_connect_args(self, url: Any) -> Any:
        return [], {}

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        raise sqlite3.OperationalError(f"{REFUSED}\n\tIs the server running on that host?")


@pytest.fixture
def refusing_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.impls, "refusing", lambda: RefusingServer)


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search or tune that starts fails the test: the storage is checked before the work."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started its work before its storage was checked")

    for name in ("search_outcome", "tune", "validate"):
        monkeypatch.setattr(api, name, started)


def refused(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The one line a refused command prints on stderr (exit 2, no traceback, within seconds);
    nothing is created in the working folder."""
    start = time.perf_counter()
    code, out, err = planner_main(args, monkeypatch, cwd=tmp_path)
    assert code == 2, out + err
    assert time.perf_counter() - start < 2 * CONNECT_TIMEOUT_S
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
    return err.strip()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_server_is_one_line_naming_the_url_and_the_fix(
    command: str, refusing_server: None, nothing_runs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = "refusing://nobody:secret@127.0.0.1:1/x"
    line = refused([*COMMANDS[command], "--storage", url], monkeypatch, tmp_path)
    assert line == (
        "error: --storage 'refusing://nobody:***@127.0.0.1:1/x': cannot connect to the database server"
        f" ({REFUSED}); start the server or fix the host, port, user, password or database name in the URL,"
        " or use a file, e.g. sqlite:///search.db"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_url_whose_driver_is_not_installed_says_so(
    command: str, nothing_runs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)  # importing it raises ImportError
    line = refused([*COMMANDS[command], "--storage", "mysql+pymysql://nobody@127.0.0.1:1/x"], monkeypatch, tmp_path)
    assert line.startswith("error: --storage 'mysql+pymysql://nobody@127.0.0.1:1/x': its database driver is not")
    assert "pymysql" in line and line.endswith("; e.g. sqlite:///search.db")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql+pymysql://u@h/x", {"connect_timeout": CONNECT_TIMEOUT_S}),
        ("postgresql+psycopg2://u@h/x", {"connect_timeout": CONNECT_TIMEOUT_S}),
        ("postgresql+pg8000://u@h/x", {"timeout": CONNECT_TIMEOUT_S}),
        ("mysql+mysqlconnector://u@h/x", {"connection_timeout": CONNECT_TIMEOUT_S}),
        ("mysql+pymysql://u@h/x?connect_timeout=30", {}),  # the user's own timeout is kept
        ("oracle+oracledb://u@h/x", {}),  # no such keyword known: the driver's default
    ],
)
def test_the_connect_timeout_is_each_drivers_own_keyword(url: str, expected: dict[str, int]) -> None:
    assert connect_args(make_url(url)) == expected


@pytest.mark.parametrize("url", ["mysql+pymysql://nobody@127.0.0.1:1/x", "postgresql+psycopg2://nobody@127.0.0.1:1/x"])
def test_a_real_driver_to_a_closed_port_is_one_line(
    url: str, nothing_runs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip(url.split("+")[1].split(":")[0], reason="the driver is not installed here")
    line = refused([*COMMANDS["validate"], "--storage", url], monkeypatch, tmp_path)
    assert line.startswith(f"error: --storage {url!r}: cannot connect to the database server (")
    assert "refused" in line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_sqlite_file_that_is_not_a_database_is_one_line(
    command: str, nothing_runs: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    junk = tmp_path / "plan.json"
    junk.write_text('{"schema_version": 2}\n' * 200)
    code, out, err = planner_main([*COMMANDS[command], "--storage", "sqlite:///plan.json"], monkeypatch, cwd=tmp_path)
    assert code == 2 and "Traceback" not in out + err and len(err.strip().splitlines()) == 1, out + err
    assert err.strip() == (
        "error: --storage 'sqlite:///plan.json': 'plan.json' is not an SQLite database (file is not a database);"
        " give the study's database file, or a new file name, e.g. sqlite:///search.db"
    )
    assert junk.read_text() == '{"schema_version": 2}\n' * 200  # read, never written


def test_an_empty_or_real_sqlite_file_passes_the_check(tmp_path: Path) -> None:
    from planner.cli.checks import check_storage

    (tmp_path / "empty.db").touch()
    sqlite3.connect(tmp_path / "real.db").execute("create table t (x)").connection.close()
    for name in ("empty.db", "real.db"):
        check_storage("--storage", f"sqlite:///{tmp_path / name}")
