"""Optuna, imported where a study is made and not before: its import costs every ``planner``
process about 0.14 s (each rank of ``planner run`` and ``planner profile`` among them), and most
commands make no study.

Optuna sets its own logger to INFO when it is first imported, so a log level asked for earlier
(the command line asks for warnings only, ``set_optuna_verbosity``) is applied again here.
"""

import sys
from types import ModuleType

_verbosity: list[int] = []
"""The level asked for by ``set_optuna_verbosity``, if any (one entry)."""


def set_optuna_verbosity(level: int) -> None:
    """Log optuna's messages at ``level`` (``logging.WARNING``) and above: now if optuna is
    imported, else from its import by ``optuna_module`` on."""
    _verbosity[:] = [level]
    if "optuna" in sys.modules:
        sys.modules["optuna"].logging.set_verbosity(level)


def optuna_module() -> ModuleType:
    """The optuna module, at the verbosity ``set_optuna_verbosity`` asked for."""
    import optuna

    if _verbosity:
        optuna.logging.set_verbosity(_verbosity[0])
    return optuna
