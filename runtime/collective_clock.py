"""The time one rank spends inside collectives, summed: the wait half of ``runtime.stragglers``.

``CollectiveClock.running`` replaces torch.distributed's collective functions, for the block it
guards, with ones that add their wall time to ``inside_s`` (two ``perf_counter`` calls per
collective, no synchronisation of their own), and puts the originals back on exit. It times what
is called through ``torch.distributed``'s functions, synchronously: the runtime's own collectives
(gradient all-reduces and ZeRO-1 broadcasts, tensor-parallel, expert all-to-alls, the loss,
vocabulary passes), FSDP's when it runs them synchronously, and the step's barriers; and DTensor's
(the dense tensor-parallel layers' gathers, reduce-scatters and all-reduces), which go through
``torch.distributed._functional_collectives`` (``FUNCTIONAL``): those return a tensor that waits
on first use, and the clock waits for it at once, inside its time (on CPU, where the clock runs,
gloo's thread would have done the work by then anyway). The waits of
asynchronous work (``async_op=True``, the pipeline schedule's sends and receives) happen in
``Work.wait`` and count as compute: which is why ``runtime.stragglers`` compares a rank only with
ranks of the same pipeline stage.

It also sums that time per process group (``inside_by_group_s``, keyed by the group's global
ranks, sorted: the default group's key is every rank), the wait half of ``runtime.slow_links``.
A group's ranks are looked up once per group object and cached (no communication).

On CUDA a collective returns once queued, so the host clock would see almost nothing. There the
clock records a CUDA event on the current stream before and after each collective instead: a
synchronous collective returns after making the current stream wait for NCCL's, so the two
events bracket the time the stream spent in the collective, waiting for its peers included; what
was queued before it runs before the first event and counts as compute. The events are read
(``settle``: ``elapsed_time``, waiting for the last event first) only when ``inside_s`` or
``inside_by_group_s`` is asked for, which ``planner run`` does after the step's closing
``torch.cuda.synchronize``, so reading costs no wait. Cost: two event records a collective (a few
microseconds of host time each, no synchronisation), where a ``synchronize`` around each
collective would drain the launch queue every time and serialise FSDP's prefetches with the
compute they overlap. What events cannot see: an ``async_op`` collective's time, as on the CPU.
An injected slow link on CUDA synchronises before its sleep, so the sleep lies between the
events rather than hidden behind queued work.
"""

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh

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

FUNCTIONAL = ("all_reduce", "all_gather_single", "all_gather_tensor", "reduce_scatter_single", "reduce_scatter_tensor")
"""The functional collectives (``torch.distributed._functional_collectives``, DTensor's) it times."""


GroupKey = tuple[int, ...]
"""A process group's global ranks, sorted."""


def _group_position(collective: Callable[..., Any]) -> int | None:
    """Where ``collective`` takes its ``group`` argument positionally (None: it takes none)."""
    try:
        names = list(inspect.signature(collective).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("group") if "group" in names else None


class CollectiveClock:
    """Seconds this rank spent inside collectives while ``running``, in all and per process group
    (mutable: it accumulates)."""

    def __init__(self, device: torch.device | None = None) -> None:
        """``device``: the compute device; a CUDA one is timed by events (module docstring)."""
        self._inside_s = 0.0
        self._inside_by_group_s: dict[GroupKey, float] = {}
        self.device = device
        self._cuda = device is not None and device.type == "cuda"
        self._pending: list[tuple[GroupKey | None, torch.cuda.Event, torch.cuda.Event]] = []
        """CUDA: each timed collective's group key and (start, end) events, not yet read."""
        self.injected_delay: tuple[frozenset[int], float] | None = None
        """Testing (a slow link): (ranks, seconds): each collective of a group holding all these
        ranks, other than the default group, first sleeps that long, inside the clock's time."""
        self._depth = 0
        """Collectives in progress: one that calls another is timed once."""
        self._keys: dict[Any, GroupKey] = {}
        """Per group object seen (None: the default group), its key."""

    @property
    def inside_s(self) -> float:
        """Seconds inside collectives so far (on CUDA, once their events are read: ``settle``)."""
        self.settle()
        return self._inside_s

    @property
    def inside_by_group_s(self) -> dict[GroupKey, float]:
        """Per group (its global ranks, sorted): seconds inside its collectives."""
        self.settle()
        return self._inside_by_group_s

    def _add(self, key: GroupKey | None, elapsed_s: float) -> None:
        self._inside_s += elapsed_s
        if key is not None:
            self._inside_by_group_s[key] = self._inside_by_group_s.get(key, 0.0) + elapsed_s

    def settle(self) -> None:
        """Add the pending CUDA events' times (waiting for the last one, normally done already)."""
        if not self._pending:
            return
        self._pending[-1][2].synchronize()
        for key, start, end in self._pending:
            self._add(key, start.elapsed_time(end) / 1e3)  # milliseconds
        self._pending.clear()

    def group_key(self, group: Any) -> GroupKey:
        """The key of a process group (None: the default group; a functional collective's
        ``(mesh, dim)`` or one-dimensional mesh too), looked up once per group object."""
        key = self._keys.get(group)
        if key is None:
            key = self._keys[group] = tuple(sorted(_ranks(group)))
        return key

    def _delay_s(self, key: GroupKey) -> float:
        if self.injected_delay is None:
            return 0.0
        ranks, delay_s = self.injected_delay
        slowed = ranks <= set(key) and key != self.group_key(None)
        return delay_s if slowed else 0.0

    def _timed(self, collective: Callable[..., Any], functional: bool = False) -> Callable[..., Any]:
        """``collective`` timed; a ``functional`` one's result waited for inside the time."""
        position = _group_position(collective)

        @wraps(collective)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return collective(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            began = self._event()
            group = kwargs.get("group", args[position] if position is not None and len(args) > position else None)
            try:
                key = self.group_key(group)
            except (ValueError, RuntimeError, TypeError):  # not a group this process names: timed in all only
                key = None
            try:
                if key is not None and self.injected_delay is not None:
                    self._sleep(self._delay_s(key))
                result = collective(*args, **kwargs)
                if functional and isinstance(result, funcol.AsyncCollectiveTensor):
                    result = result.wait()
                return result
            finally:
                if began is not None:
                    self._pending.append((key, began, self._event_now()))
                else:
                    self._add(key, time.perf_counter() - start)
                self._depth -= 1

        return timed

    def _event(self) -> torch.cuda.Event | None:
        """A timing event recorded now on the current stream (CUDA), else None."""
        return self._event_now() if self._cuda else None

    def _event_now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def _sleep(self, delay_s: float) -> None:
        """The injected delay; on CUDA after the queued work, so the events see it."""
        if delay_s and self._cuda:
            torch.cuda.synchronize(self.device)
        time.sleep(delay_s)

    @contextmanager
    def running(self) -> Iterator["CollectiveClock"]:
        """Time every collective called in the block (see the module docstring)."""
        originals = {name: getattr(dist, name) for name in TIMED if hasattr(dist, name)}
        functional = {name: getattr(funcol, name) for name in FUNCTIONAL if hasattr(funcol, name)}
        for name, collective in originals.items():
            setattr(dist, name, self._timed(collective))
        for name, collective in functional.items():
            setattr(funcol, name, self._timed(collective, functional=True))
        try:
            yield self
        finally:
            for name, collective in originals.items():
                setattr(dist, name, collective)
            for name, collective in functional.items():
                setattr(funcol, name, collective)


def _ranks(group: Any) -> list[int]:
    """A group's global ranks: the default group's (None), a process group's, a mesh dimension's
    (``(mesh, dim)``) or a one-dimensional mesh's; TypeError for other forms (lists of ranks)."""
    if group is None:
        return list(range(dist.get_world_size()))
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        return dist.get_process_group_ranks(group[0].get_group(group[1]))
    if isinstance(group, DeviceMesh):
        return dist.get_process_group_ranks(group.get_group())
    if isinstance(group, dist.ProcessGroup):
        return dist.get_process_group_ranks(group)
    raise TypeError(f"a group given as {type(group).__name__}")
