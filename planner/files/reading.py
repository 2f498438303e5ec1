"""Reading the planner's files: text, JSON or YAML mappings, packaged presets, and pydantic's errors
turned into one SchemaError that names the file, the key, the value and what is expected."""

import difflib
import json
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.schemas.errors import SchemaError

_M = TypeVar("_M", bound=BaseModel)


def preset_dir(kind: str) -> Traversable:
    return resources.files("planner") / "presets" / kind


def list_presets(kind: str) -> tuple[str, ...]:
    folder = preset_dir(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")))


def preset_named(spec: str, presets: tuple[str, ...]) -> str | None:
    """The preset ``spec`` names, whatever its case (``Llama3-8B`` is ``llama3-8b``), or None."""
    return next((preset for preset in presets if preset.casefold() == spec.casefold()), None)


def did_you_mean(spec: str, presets: tuple[str, ...]) -> str:
    """``" (did you mean 'llama3-8b'?)"`` for the preset closest to ``spec``, or "" if none is close.
    A preset ``spec`` begins is closest (``dgx-a100`` is ``dgx-a100-80g``, not the fewer edits away
    ``dgx-h100``); where several begin so, all of them."""
    wanted = spec.casefold()
    extended = [preset for preset in presets if preset.startswith(wanted)] if wanted else []
    if len(extended) > 1:
        return f" (did you mean one of {', '.join(map(repr, extended))}?)"
    close = extended or difflib.get_close_matches(wanted, presets, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_preset(kind: str, name: str) -> Mapping[str, object]:
    resource = preset_dir(kind) / f"{name}.yaml"
    return parse(resource.read_text(encoding="utf-8"), f"preset {kind}/{name}.yaml", as_json=False)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SchemaError(f"cannot read {str(path)!r}: {e}") from e


def read_mapping_file(path: Path) -> Mapping[str, object]:
    return parse(read_text(path), str(path), as_json=path.suffix.lower() == ".json")


def too_deep(where: str, e: RecursionError) -> SchemaError:
    """The one line for a file nested deeper than Python's parsers recurse (a fuzzer's ``[[[[...``):
    no planner file nests more than a few levels, so the file is not one of ours."""
    return SchemaError(f"{where}: nested too deeply to read ({e}); give a planner file (a few levels deep)")


def load_json(text: str, where: str) -> Any:
    """``json.loads(text)``, its syntax errors and too-deep nesting one SchemaError naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    except RecursionError as e:
        raise too_deep(where, e) from e


def parse(text: str, where: str, *, as_json: bool) -> Mapping[str, object]:
    """Parse JSON or YAML text into a mapping, naming the file and line of a syntax error."""
    try:
        data = load_json(text, where) if as_json else yaml.safe_load(text)
    except RecursionError as e:
        raise too_deep(where, e) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SchemaError(f"{where}: malformed YAML{at}: {problem}") from e
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: the top level must be a mapping, not {type(data).__name__}")
    return data


def validate(model: type[_M], values: Mapping[str, object], what: str) -> _M:
    """``model.model_validate(values)`` with pydantic's errors turned into one SchemaError."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        raise SchemaError(describe(e, what, model)) from e
    except SchemaError as e:
        raise SchemaError(f"{what}: {e}") from e


def describe(error: ValidationError, what: str, model: type[BaseModel] | None) -> str:
    """One line per problem: the key, the bad value, what is expected."""
    lines = []
    for problem in error.errors():
        loc = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        field = model.model_fields.get(str(problem["loc"][0])) if model and problem["loc"] else None
        about = f" ({field.description})" if field is not None and field.description else ""
        if problem["type"] == "missing":
            lines.append(f"missing required key {loc!r}{about}")
        else:
            lines.append(f"{loc}={problem['input']!r}: {problem['msg']}{about}")
    if len(lines) == 1:
        return f"{what}: {lines[0]}"
    return f"{what} has {len(lines)} problems:\n" + "\n".join(f"  {line}" for line in lines)
