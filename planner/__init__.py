"""Automatic parallel-configuration planner for distributed LLM training.

The Python API lives in ``planner.api``; its functions are re-exported here lazily so that
importing ``planner.schemas`` (as ``cost_models`` does) stays light.
"""

from typing import Any

_API = ("estimate", "load_cluster", "load_model", "load_plan", "save_plan", "search")
_SCHEMAS = ("ClusterProfile", "Estimate", "Layout", "ModelSpec", "Plan", "TrainingSpec")
__all__ = [*_API, *_SCHEMAS]


def __getattr__(name: str) -> Any:
    if name in _API:
        from planner import api

        return getattr(api, name)
    if name in _SCHEMAS:
        from planner import schemas

        return getattr(schemas, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
