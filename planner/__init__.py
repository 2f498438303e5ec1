"""Automatic parallel-configuration planner for distributed LLM training.

The Python API lives in ``planner.api``; its functions are re-exported here lazily so that
importing ``planner.schemas`` (as ``cost_models`` does) stays light.
"""

from typing import Any

__all__ = ["estimate", "load_cluster", "load_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
