"""Checks a command makes on its outputs before it starts its work: a search, a profile or a tune
that runs for minutes must not fail at the end on a path it could have refused at once."""

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from planner.schemas.errors import SchemaError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


def check_output(option: str, path: Path | None, example: str = "plan.json") -> None:
    """Refuse a file ``path`` that cannot be written: a folder, in a missing folder, or not writable.
    ``option`` names it in the message; ``example`` is a file name to suggest in a folder.

    Raises:
        SchemaError: naming the option, the path and the fix.
    """
    if path is None:
        return
    if path.is_dir():
        raise SchemaError(f"{option} {str(path)!r} is a folder; give a file in it, e.g. {str(path / example)!r}")
    folder = path.parent
    refuse_file_in_the_way(option, path)
    if not folder.is_dir():
        raise SchemaError(f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SchemaError(f"{option} {str(path)!r} cannot be written (permission denied); give another path")


def refuse_file_in_the_way(option: str, path: Path) -> None:
    """Refuse a path one of whose folders is a file (``--output notes.txt/plan.json``): a missing
    folder's fix, "create it first", cannot be done there.

    Raises:
        SchemaError: naming the option, the file in the way and the fix.
    """
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise SchemaError(f"{option} {str(path)!r}: {str(blocking)!r} is a file, not a folder; give a path in a folder")


def check_input(option: str, path: Path | None) -> None:
    """Refuse an input file ``path`` that is missing, a folder, or not readable: every rank would
    otherwise fail on it with a traceback.

    Raises:
        SchemaError: naming the option, the path and the fix.
    """
    if path is None:
        return
    if not path.exists():
        raise SchemaError(f"{option} {str(path)!r} does not exist; give an existing file")
    if not path.is_file():
        raise SchemaError(f"{option} {str(path)!r} is not a file; give a file")
    if not os.access(path, os.R_OK):
        raise SchemaError(f"{option} {str(path)!r} cannot be read (permission denied); give another file")


def check_folder(option: str, path: Path | None) -> None:
    """Refuse a folder ``path`` (made if missing) that is a file, or lies in one.

    Raises:
        SchemaError: naming the option, the path and the fix.
    """
    if path is None:
        return
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise SchemaError(f"{option} {str(path)!r}: {str(blocking)!r} is a file, not a folder; give a folder")


CONNECT_TIMEOUT_S = 5
"""Seconds a storage check waits for a database server: an address that drops packets would
otherwise hold the command for the system's TCP timeout (minutes) before it says anything."""

CONNECT_TIMEOUT_ARGS = {
    "psycopg": "connect_timeout",
    "psycopg2": "connect_timeout",
    "pg8000": "timeout",
    "pymysql": "connect_timeout",
    "mysqldb": "connect_timeout",
    "mariadbconnector": "connect_timeout",
    "mysqlconnector": "connection_timeout",
}
"""The connect-timeout keyword of each database driver SQLAlchemy names (``dialect.driver``) that
has one; a driver not listed connects with its own default."""

STORAGE_EXAMPLE = "e.g. sqlite:///search.db"


def check_storage(option: str, url: str) -> None:
    """Refuse an Optuna storage URL that cannot open: not a database URL, a database whose driver
    is not installed, a database server that cannot be reached (connection refused, unknown host,
    no answer within ``CONNECT_TIMEOUT_S``, login refused), or an SQLite file that cannot be
    written (``check_output``). Only a server is connected to: an SQLite file is not created here.

    Raises:
        SchemaError: naming the option, the URL (its password hidden) and the fix.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except (ArgumentError, ValueError) as e:
        raise SchemaError(f"{option} {url!r} is not a database URL ({e}); {STORAGE_EXAMPLE}") from e
    except ImportError as e:  # sqlalchemy's NoSuchModuleError is an ArgumentError; a missing driver is this
        shown = parsed.render_as_string(hide_password=True)
        raise SchemaError(f"{option} {shown!r}: its database driver is not installed ({e}); {STORAGE_EXAMPLE}") from e
    if parsed.get_backend_name() != "sqlite":
        _check_server(option, parsed)
    elif parsed.database not in (None, "", ":memory:"):
        check_output(f"{option} {url!r}: the database file", Path(parsed.database), "search.db")
        if Path(parsed.database).is_file():
            _check_sqlite_file(option, parsed)


def connect_args(url: "URL") -> dict[str, int]:
    """The keyword arguments that bound the driver's connect to ``CONNECT_TIMEOUT_S``: none where the
    driver has no such keyword or the URL sets it already (the user's value wins)."""
    keyword = CONNECT_TIMEOUT_ARGS.get(url.get_dialect().driver)
    return {} if keyword is None or keyword in url.query else {keyword: CONNECT_TIMEOUT_S}


def _check_server(option: str, url: "URL") -> None:
    """Connect once to the database server of ``url`` and close; a failure is one line (the
    driver's first line of its reason), not the traceback Optuna would end in later."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url, connect_args=connect_args(url))
    try:
        with engine.connect():
            pass
    except DBAPIError as e:
        reason = (str(e.orig) if e.orig is not None else str(e)).strip().splitlines()[0]
        shown = url.render_as_string(hide_password=True)
        raise SchemaError(
            f"{option} {shown!r}: cannot connect to the database server ({reason}); start the server or fix"
            f" the host, port, user, password or database name in the URL, or use a file, {STORAGE_EXAMPLE}"
        ) from e
    finally:
        engine.dispose()


def _check_sqlite_file(option: str, url: "URL") -> None:
    """Read the schema version of an existing SQLite file (its header; nothing is written): a file
    that is not a database (a plan, a text file given by mistake) is one line here, not the
    traceback Optuna would end in when it reads its tables."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("PRAGMA schema_version"))
    except DBAPIError as e:
        reason = (str(e.orig) if e.orig is not None else str(e)).strip().splitlines()[0]
        raise SchemaError(
            f"{option} {url.render_as_string()!r}: {url.database!r} is not an SQLite database ({reason});"
            f" give the study's database file, or a new file name, {STORAGE_EXAMPLE}"
        ) from e
    finally:
        engine.dispose()


def in_range(minimum: float | None = None, maximum: float | None = None) -> Callable[[float | None], float | None]:
    """Callback of a float option: refuse NaN and infinity by name, then a value outside
    [``minimum``, ``maximum``]. Used in place of typer's ``min``/``max``, whose check refuses NaN as
    out of range ("should be less than or equal to 0.9") without saying what is wrong with it."""
    limits = (f">= {minimum:g}" if minimum is not None else "", f"<= {maximum:g}" if maximum is not None else "")
    bounds = " and ".join(text for text in limits if text)
    wanted = f"; give a number {bounds}" if bounds else "; give a finite number"

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        if math.isnan(value):
            raise typer.BadParameter(f"nan is not a number{wanted}")
        if math.isinf(value):
            raise typer.BadParameter(f"{value} is not a finite number{wanted}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise typer.BadParameter(f"{value:g} is out of range{wanted}")
        return value

    return check


def check_plot_file(path: Path | None) -> None:
    """Refuse, before any work, a --plot FILE that cannot be written as a PNG."""
    if path is None:
        return
    if path.suffix.lower() != ".png":
        raise SchemaError(f"--plot {path} must name a .png file, e.g. --plot search.png")
    if path.is_dir():
        raise SchemaError(f"--plot {path} is a directory; name a .png file in it, e.g. --plot {path / 'search.png'}")
    parent = path.parent
    refuse_file_in_the_way("--plot", path)
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise SchemaError(f"--plot {path}: the directory {parent} does not exist or is not writable; create it first")


def check_plot_dir(path: Path | None) -> None:
    """Refuse, before any work, a --plot DIR that is a file or cannot be created or written;
    create it if its parent exists."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise SchemaError(f"--plot {path} is a file; name a directory for the plots, e.g. --plot plots")
    if not path.exists():
        refuse_file_in_the_way("--plot", path)
        if not path.parent.is_dir():
            raise SchemaError(f"--plot {path}: its parent {path.parent} does not exist; create it first")
        try:
            path.mkdir()
        except OSError as e:
            raise SchemaError(f"--plot {path} cannot be created ({e.strerror}); name a writable directory") from e
    if not os.access(path, os.W_OK):
        raise SchemaError(f"--plot {path} is not writable; name a writable directory")
