"""Automatic parallel-configuration planner for distributed LLM training.

The Python API lives in ``planner.api``; its names (``planner.api.__all__``, listed there once)
and the main data types are reached here lazily, so that importing ``planner.schemas`` (as
``cost_models`` does) stays light. No subpackage shares a name with an API function (the search
is ``planner.search_engine``, the tuner ``planner.tuning``): importing a subpackage sets it as an
attribute of this package, which would hide the function of that name.
"""

import importlib
from typing import Any

_MODULES = ("api", "schemas")
"""Subpackages reached as attributes after ``import planner`` alone (``planner.api.search``)."""
_SCHEMAS = ("ClusterProfile", "Estimate", "Layout", "ModelSpec", "Plan", "RunReport", "TrainingSpec")


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"planner.{name}")
    if name in _SCHEMAS:
        from planner import schemas

        return getattr(schemas, name)
    if name.startswith("__") and name != "__all__":  # inspect and pytest probe dunders: no API for them
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    from planner import api

    if name == "__all__":
        return [*api.__all__, *_SCHEMAS]
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API and the subpackages ``dir(planner)`` and completion offer: the names are reached
    lazily (``__getattr__``), so the module's own namespace holds none of them."""
    return sorted({*globals(), *_MODULES, *__getattr__("__all__")})
