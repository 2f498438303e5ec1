"""The one place that decides whether a command can run without torch.

Planning (search, estimate, explain, export, launch, presets, replan without a checkpoint) needs
no torch, so ``pip install planner`` leaves it out; profiling, running a plan, its dry run and a
local tune need the runtime extra. Each flow that needs it calls ``require_torch`` before its first
torch import, so a missing torch is one line naming the extra rather than an import traceback.
"""

import importlib.util

from planner.schemas.errors import MissingExtraError

RUNTIME_EXTRA = "planner[runtime]"
"""The extra that brings torch, in the range the runtime supports (pyproject.toml)."""


def torch_installed() -> bool:
    """Whether ``import torch`` can find a module, without importing it (which takes seconds)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a finder that refuses torch, or a torch entry set to None
        return False


def require_torch(command: str) -> None:
    """Refuse ``command`` when torch is not installed.

    Args:
        command: what needs torch, as the user typed it (``planner run``, ``planner run --dry-run``).

    Raises:
        MissingExtraError: torch cannot be found; the message names the extra to install.
    """
    if not torch_installed():
        raise MissingExtraError(f"{command} needs torch: pip install '{RUNTIME_EXTRA}'")
