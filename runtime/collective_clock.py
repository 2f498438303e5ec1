"""The time one rank spends inside collectives, summed: the wait half of ``runtime.stragglers``.

``CollectiveClock.running`` replaces torch.distributed's collective functions, for the block it
guards, with ones that add their wall time to ``inside_s`` (two ``perf_counter`` calls per
collective, no synchronisation of their own), and puts the originals back on exit. It times what
is called through ``torch.distributed``'s functions, synchronously: the runtime's own collectives
(gradient all-reduces and ZeRO-1 broadcasts, tensor-parallel, expert all-to-alls, the loss,
vocabulary passes), FSDP's when it runs them synchronously, and the step's barriers. The waits of
asynchronous work (``async_op=True``, the pipeline schedule's sends and receives) happen in
``Work.wait`` and count as compute: which is why ``runtime.stragglers`` compares a rank only with
ranks of the same pipeline stage.

Under NCCL a collective returns once queued, so this clock would see almost nothing: timing
CUDA events around each collective is the way there (not done; ``planner run`` on CUDA skips
straggler detection).
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import torch.distributed as dist

TIMED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
)
"""The torch.distributed functions the clock times (those this torch has)."""


class CollectiveClock:
    """Seconds this rank spent inside collectives while ``running`` (mutable: it accumulates)."""

    def __init__(self) -> None:
        self.inside_s = 0.0
        self._depth = 0
        """Collectives in progress: one that calls another is timed once."""

    def _timed(self, collective: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(collective)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return collective(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return collective(*args, **kwargs)
            finally:
                self.inside_s += time.perf_counter() - start
                self._depth -= 1

        return timed

    @contextmanager
    def running(self) -> Iterator["CollectiveClock"]:
        """Time every collective called in the block (see the module docstring)."""
        originals = {name: getattr(dist, name) for name in TIMED if hasattr(dist, name)}
        for name, collective in originals.items():
            setattr(dist, name, self._timed(collective))
        try:
            yield self
        finally:
            for name, collective in originals.items():
                setattr(dist, name, collective)
