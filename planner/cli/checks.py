"""Checks a command makes on its outputs before it starts its work: a search, a profile or a tune
that runs for minutes must not fail at the end on a path it could have refused at once."""

import math
import os
from pathlib import Path

import typer

from planner.schemas.errors import SchemaError


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
    if not folder.is_dir():
        raise SchemaError(f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SchemaError(f"{option} {str(path)!r} cannot be written (permission denied); give another path")


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


def check_storage(option: str, url: str) -> None:
    """Refuse an Optuna storage URL that cannot open: not a database URL, a database whose driver
    is not installed, or an SQLite file that cannot be written (``check_output``).

    Raises:
        SchemaError: naming the option, the URL and the fix.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    example = "e.g. sqlite:///search.db"
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except (ArgumentError, ValueError) as e:
        raise SchemaError(f"{option} {url!r} is not a database URL ({e}); {example}") from e
    except ImportError as e:  # sqlalchemy's NoSuchModuleError is an ArgumentError; a missing driver is this
        raise SchemaError(f"{option} {url!r}: its database driver is not installed ({e}); {example}") from e
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        check_output(f"{option} {url!r}: the database file", Path(parsed.database), "search.db")


def finite(value: float | None) -> float | None:
    """Callback of the float options: NaN and infinity are refused (a range check lets NaN through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def check_plot_file(path: Path | None) -> None:
    """Refuse, before any work, a --plot FILE that cannot be written as a PNG."""
    if path is None:
        return
    if path.suffix.lower() != ".png":
        raise SchemaError(f"--plot {path} must name a .png file, e.g. --plot search.png")
    if path.is_dir():
        raise SchemaError(f"--plot {path} is a directory; name a .png file in it, e.g. --plot {path / 'search.png'}")
    parent = path.parent
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
        if not path.parent.is_dir():
            raise SchemaError(f"--plot {path}: its parent {path.parent} does not exist; create it first")
        try:
            path.mkdir()
        except OSError as e:
            raise SchemaError(f"--plot {path} cannot be created ({e.strerror}); name a writable directory") from e
    if not os.access(path, os.W_OK):
        raise SchemaError(f"--plot {path} is not writable; name a writable directory")
