"""Automatic parallel-configuration planner for distributed LLM training.

The Python API lives in ``planner.api``; its names are re-exported here lazily so that importing
``planner.schemas`` (as ``cost_models`` does) stays light. No subpackage shares a name with an
API function (the search is ``planner.search_engine``, the tuner ``planner.tuning``): importing a
subpackage sets it as an attribute of this package, which would hide the function of that name.
"""

import importlib
from typing import Any

_API = (
    "Budget",
    "ExportTarget",
    "OptimizerName",
    "Selection",
    "StrategyName",
    "TuneSettings",
    "compare_placements",
    "dropped_token_share",
    "dry_run",
    "expert_traffic",
    "estimate",
    "load_cluster",
    "load_model",
    "load_plan",
    "make_plan",
    "profile",
    "replan",
    "run",
    "save_plan",
    "search",
    "search_outcome",
    "tune",
    "validate",
)
_MODULES = ("api", "schemas")
"""Subpackages reached as attributes after ``import planner`` alone (``planner.api.search``)."""
_SCHEMAS = ("ClusterProfile", "Estimate", "Layout", "ModelSpec", "Plan", "RunReport", "TrainingSpec")
__all__ = [*_API, *_SCHEMAS]


def __getattr__(name: str) -> Any:
    if name in _API:
        from planner import api

        return getattr(api, name)
    if name in _MODULES:
        return importlib.import_module(f"planner.{name}")
    if name in _SCHEMAS:
        from planner import schemas

        return getattr(schemas, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
