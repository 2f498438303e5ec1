"""Makes torch unimportable in an interpreter that has it, as if it were not installed.

Put this folder first on a subprocess's PYTHONPATH: Python imports ``sitecustomize`` at start-up,
and the finder below, first on ``sys.meta_path``, refuses ``torch`` and its submodules before the
installed one is found. When ``NO_TORCH_LOG`` names a file, each refused name is appended to it, so
a test can tell code that never tried torch from code that tried and swallowed the ImportError.
"""

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoTorch(importlib.abc.MetaPathFinder):
    """Refuses torch as a missing package would: ModuleNotFoundError naming it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.split(".")[0] != "torch":
            return None
        log = os.environ.get("NO_TORCH_LOG")
        if log:
            with open(log, "a") as f:
                f.write(fullname + "\n")
        raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


sys.meta_path.insert(0, _NoTorch())
