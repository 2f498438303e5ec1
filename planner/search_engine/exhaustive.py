"""Exhaustive search with memory-bound pruning, over the cores the process may use.

Every candidate group of the space's axes (``SearchSpace.groups``: layouts that differ only in
recomputation) is tried in order of increasing recomputation; the first that fits dominates the
rest of its group (same layout, more time, less memory), so they are not priced. In a group of
more than three (an MoE model's recompute modules) whose first does not fit, the last (full
recompute, the least memory) is tried next: if it does not fit, neither do those between; if it
does, the first between that fits is found by bisection (``_first_fitting``). Memory is
checked before time, and before memory the model states alone (``Evaluator.cannot_fit``): a
layout they rule out is counted as asked, as if evaluated, but costs a memoized look-up, so the
result (the closest miss included) and the budget's meaning are those of evaluating it.
Where a group's first (no recompute) did not fit and another did, the first with the fewest of
each stage's layers recomputed in full that fit (``Evaluator.least_recompute``) is priced too,
and the faster of the two stands for the group (``_least_recompute``).
Where a search found nothing that fits, it runs again with every layout offered the least
optimizer offload that fits and, without recompute or a pipeline, the least activation offload
(``Evaluator.offload``, ``Evaluator.offers``): then each layout of a group is priced, as more
recompute needs less offload and neither dominates, and the fastest that fits stands for the group.

Asked for its fastest ``keep`` (as a search's runner asks), it skips the groups that cannot be
among them: once ``keep`` candidates are found, a group whose step-time floor
(``cost_models.step_floor``, shared by layouts that differ only in recompute, ZeRO, sharding
groups and schedule) is above the slowest of the fastest ``keep`` so far is not asked
(``_Fastest``). The fastest ``keep`` are those of the full search; fewer layouts are evaluated
(DeepSeek-V3 on 1,024 H100s under Megatron-LM: 51 thousand of 342 thousand instead of 196).

A large space is split over forked worker processes (Linux): each takes whole blocks of groups
that share their parallel degrees (``SearchSpace.blocks``), builds their layouts and evaluates
them, so the micro-batch pruning of ``Evaluator.cannot_fit`` stays within one worker; the parent
merges what they found in search order. The result is the serial one: the same candidates in
the same order, the same count of layouts asked, the same closest miss (the smallest, the first
in search order on ties). A layout budget (``Budget.max_trials``) counts in search order, so it
runs serially.
"""

import heapq
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import ClassVar

from cost_models.step_floor import FACTOR_FIELDS, RELAXED_FIELDS
from planner.schemas import Layout, MemoryBreakdown, Recompute
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.settings import Budget
from planner.search_engine.axes import AXES, Assignment, as_int
from planner.search_engine.evaluate import Evaluator, LayoutPoint, Miss
from planner.search_engine.space import LayoutGroup, SearchSpace
from planner.search_engine.strategy import Candidate, Progress, SearchResult, fastest_first

PARALLEL_MIN_BLOCKS = 64
"""Blocks below which the search stays in one process: forking and merging cost about 0.1 s."""

Index = tuple[int, int]
"""A group's place in search order: (its block, its place in the block)."""
Block = tuple[int, Assignment]
"""A block of groups (``SearchSpace.blocks``) with its place in search order."""


@dataclass(frozen=True, slots=True)
class _Scan:
    """What one pass over some blocks found, each item with its group's index in search order."""

    found: tuple[tuple[Index, Candidate], ...]
    asked: int
    complete: bool
    miss: tuple[Index, Miss] | None
    evaluations: int
    ruled_out: int
    walked: int
    """Candidates in the groups the pass went through, asked or not (with ``complete``: all of them)."""
    outpaced: int
    """Candidates not asked because their groups' step-time floor was above the fastest found (``_Fastest``)."""
    points: tuple[LayoutPoint, ...] = ()
    """What the evaluator recorded during the pass (``Evaluator.points``), in a forked worker."""


class ExhaustiveSearch:
    """Try every candidate; exact, and fast enough for thousands of GPUs.

    Args:
        processes: worker processes for a large space; None uses the cores this process may run
            on, 1 keeps it in this process.
        min_parallel_blocks: blocks of equal degrees from which the space counts as large.
    """

    name: ClassVar[str] = "exhaustive"

    def __init__(self, processes: int | None = None, min_parallel_blocks: int = PARALLEL_MIN_BLOCKS) -> None:
        self.processes = processes
        self.min_parallel_blocks = min_parallel_blocks

    def search(
        self,
        space: SearchSpace,
        evaluate: Evaluator,
        budget: Budget,
        *,
        seed: int,
        progress: Progress | None = None,
        keep: int | None = None,
    ) -> SearchResult:
        """Evaluate every group until the budget runs out; the fastest ``keep`` that fit (None: all).

        Workers send back only their fastest ``keep``: a worker's candidates cross a pipe pickled,
        which for ten thousand estimates takes longer than a third of the search."""
        del seed  # deterministic
        blocks = list(enumerate(space.blocks()))
        deadline = None if budget.max_time_s is None else time.perf_counter() + budget.max_time_s
        processes = self._processes_for(len(blocks), budget)
        if processes > 1:
            scan = _parallel_scan(space, blocks, evaluate, deadline, processes, progress, keep)
        else:
            scan = _scan(space, blocks, evaluate, deadline, budget.max_trials, progress, len(blocks), keep)
        if progress is not None:
            progress(len(blocks), len(blocks))
        found = [candidate for _, candidate in sorted(scan.found, key=lambda item: item[0])]
        return SearchResult(
            strategy=self.name,
            feasible=fastest_first(found, keep),
            evaluated=scan.asked,
            complete=scan.complete,
            space_size=scan.walked if scan.complete else None,
            outpaced=scan.outpaced,
        )

    def _processes_for(self, blocks: int, budget: Budget) -> int:
        if blocks < self.min_parallel_blocks or budget.max_trials is not None or not _can_fork():
            return 1
        cores = self.processes if self.processes is not None else len(os.sched_getaffinity(0))
        return max(1, min(cores, blocks))


def _can_fork() -> bool:
    # Forking a process that has threads is safe only where the child touches none of their
    # locks; the workers only price layouts. Other platforms spawn, which re-imports everything.
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def _scan(
    space: SearchSpace,
    blocks: Sequence[Block],
    evaluate: Evaluator,
    deadline: float | None,
    max_trials: int | None,
    progress: Progress | None,
    total: int,
    keep: int | None = None,
) -> _Scan:
    """Evaluate the groups of ``blocks`` in order (module docstring); the first layout of a group
    that fits is kept. ``progress`` hears of every block done, out of ``total``. With ``keep``
    (and neither a layout budget nor recorded points), a group whose step-time floor is above
    the ``keep``-th fastest found so far is skipped: its layouts could not be among the fastest
    ``keep`` (``_Fastest``)."""
    evaluations, ruled_out = evaluate.evaluations, evaluate.ruled_out
    recorded = len(evaluate.points or ())
    found: list[tuple[Index, Candidate]] = []
    fastest = _Fastest(keep) if keep and max_trials is None and evaluate.points is None else None
    asked, complete, miss, walked, outpaced = 0, True, None, 0, 0
    for done, (number, block) in enumerate(blocks):
        for place, group in enumerate(space.lazy_groups(block)):
            walked += len(group)
            if fastest is not None and fastest.outpaces(evaluate, group):
                outpaced += len(group)
                continue
            if evaluate.offload:  # each with its least offload: more recompute, less offload, none dominates
                best = None
                for layout in group:
                    if _spent(asked, max_trials, deadline):
                        complete = False
                        break
                    asked += 1
                    for offered in evaluate.offers(layout):  # its least optimizer or activation offload
                        fits, miss = _try(offered, evaluate, (number, place), miss)
                        if fits is not None and (best is None or fits.estimate.step_time_s < best.estimate.step_time_s):
                            best = fits
                if best is not None:
                    found.append(((number, place), best))
                    if fastest is not None:
                        fastest.add(best)
                if not complete:
                    break
                continue
            for at in range(len(group)):  # the budget counts layouts: a group can hold several
                if _spent(asked, max_trials, deadline):
                    complete = False
                    break
                asked += 1
                fits, miss = _try(group[at], evaluate, (number, place), miss)
                if fits is not None:
                    fits = _least_recompute(group, fits, evaluate) if at else fits
                    found.append(((number, place), fits))
                    if fastest is not None:
                        fastest.add(fits)
                    break
                if len(group) - at - 1 > LONG_GROUP and max_trials is None:
                    fits, miss, checked = _first_fitting(group, at + 1, evaluate, (number, place), miss)
                    asked += checked
                    if fits is not None:
                        fits = _least_recompute(group, fits, evaluate)
                        found.append(((number, place), fits))
                        if fastest is not None:
                            fastest.add(fits)
                    if evaluate.points is not None:  # a plot draws those the bisection passed over
                        end = len(group) if fits is None else group.index(fits.layout)
                        for skipped in group[at + 1 : end]:
                            evaluate.record_point(skipped)
                    break
            if not complete:
                break
        if not complete:
            break
        if progress is not None:
            progress(done + 1, total)
    return _Scan(
        found=tuple(found),
        asked=asked,
        complete=complete,
        miss=miss,
        evaluations=evaluate.evaluations - evaluations,
        ruled_out=evaluate.ruled_out - ruled_out,
        walked=walked,
        outpaced=outpaced,
        points=tuple((evaluate.points or [])[recorded:]),
    )


def _spent(asked: int, max_trials: int | None, deadline: float | None) -> bool:
    """Whether the budget is spent: ``max_trials`` layouts asked, or the ``deadline`` passed."""
    return (max_trials is not None and asked >= max_trials) or (
        deadline is not None and time.perf_counter() >= deadline
    )


class _Fastest:
    """The step times of the fastest ``keep`` candidates found so far, and which groups they
    outpace: a group whose floor (``Evaluator.floor_of``, shared by a group's layouts,
    which differ only in recompute) is above the slowest of them, strictly, holds no layout that
    could rank among the fastest ``keep`` (``fastest_first`` ranks by step time first). Groups
    that differ only in the axes of ``cost_models.step_floor.RELAXED_FIELDS`` share the mean
    stage time under it, found by the values of the others; the floor is that mean times a factor
    (``Evaluator.floor_factor``: micro-batches and the schedule's bubble) found by the few axes it
    depends on, so a group's layout is built only where either is new."""

    __slots__ = ("_factors", "_keep", "_means", "_times")

    SHARED_BY = tuple(axis.name for axis in AXES if axis.field not in RELAXED_FIELDS)
    """The axes whose values the mean stage time depends on."""
    FACTOR_BY = tuple(axis.name for axis in AXES if axis.field in FACTOR_FIELDS)
    """The axes whose values the floor's factor depends on (``step_floor.floor_factor``)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._times: list[float] = []
        """Negated, a heap: the slowest of the fastest ``keep`` first."""
        self._means: dict[tuple[object, ...], float] = {}
        """``Evaluator.mean_stage_s`` by the values of the axes it depends on (``SHARED_BY``)."""
        self._factors: dict[tuple[object, ...], float] = {}
        """``Evaluator.floor_factor`` by the values of ``FACTOR_BY``."""

    def add(self, candidate: Candidate) -> None:
        """Count ``candidate`` among those found."""
        time_s = candidate.estimate.step_time_s
        if len(self._times) < self._keep:
            heapq.heappush(self._times, -time_s)
        elif time_s < -self._times[0]:
            heapq.heapreplace(self._times, -time_s)

    def outpaces(self, evaluate: Evaluator, group: LayoutGroup) -> bool:
        """Whether ``keep`` candidates found so far are all faster than any layout of ``group``."""
        if len(self._times) < self._keep:
            return False
        chosen = group.chosen
        shared = tuple(chosen[name] for name in self.SHARED_BY)
        mean_s = self._means.get(shared)
        if mean_s is None:
            mean_s = self._means[shared] = evaluate.mean_stage_s(group[0])
        by = tuple(chosen[name] for name in self.FACTOR_BY)
        factor = self._factors.get(by)
        if factor is None:
            factor = self._factors[by] = evaluate.floor_factor(group[0])
        return mean_s * factor > -self._times[0]


LONG_GROUP = 2
"""Layouts left in a group (after its first did not fit) above which ``_first_fitting`` searches
them by bisection: the recompute axis of an MoE model's space offers more than the three modes
(``SearchSpace.groups``), and where even its last (full recompute) does not fit, the ones between
are not priced."""


def _try(
    layout: Layout, evaluate: Evaluator, index: Index, miss: tuple[Index, Miss] | None
) -> tuple[Candidate | None, tuple[Index, Miss] | None]:
    """``layout`` priced if it fits (None if not), and the closest miss so far."""
    if evaluate.cannot_fit(layout):
        return None, miss
    before = evaluate.closest_miss
    try:
        return Candidate(layout, evaluate(layout)), miss
    except InfeasibleConfigError:
        return None, _closest_miss(evaluate, before, index, miss)


def _closest_miss(
    evaluate: Evaluator, before: Miss | None, index: Index, miss: tuple[Index, Miss] | None
) -> tuple[Index, Miss] | None:
    """The closest miss so far after a layout did not fit: the evaluator's, at ``index``, when that
    layout replaced ``before`` as its closest miss; else ``miss``."""
    if evaluate.closest_miss is not before and evaluate.closest_miss is not None:
        return (index, evaluate.closest_miss)
    return miss


def _least_recompute(group: Sequence[Layout], fits: Candidate, evaluate: Evaluator) -> Candidate:
    """``fits`` (a group's first layout that fits, after its first, without recompute, did not),
    or the group's first with the fewest layers of each stage recomputed in full that fit
    (``Evaluator.least_recompute``), whichever is faster: the layers a stage need not recompute
    are time saved, and selective recompute may keep less than those counts need."""
    if group[0].recompute is not Recompute.NONE:  # the space offers no layout without recompute
        return fits
    partial = evaluate.least_recompute(group[0])
    if partial is None:
        return fits
    try:
        est = evaluate(partial)
    except InfeasibleConfigError:
        return fits
    return Candidate(partial, est) if est.step_time_s < fits.estimate.step_time_s else fits


def _first_fitting(
    group: Sequence[Layout], start: int, evaluate: Evaluator, index: Index, miss: tuple[Index, Miss] | None
) -> tuple[Candidate | None, tuple[Index, Miss] | None, int]:
    """The first of ``group[start:]`` (the group's layouts after one that did not fit, in recompute
    order: each holds no more memory than the one before) that fits, priced; the closest miss so far;
    and how many layouts were checked. The last is checked first (if it does not fit, none
    does), then the others by bisection, on their memory alone: the same layout and closest miss
    as trying them in order (the failing layout next to the first that fits, the closest of the
    group, is always among those checked)."""

    memories: dict[int, tuple[MemoryBreakdown, ...]] = {}

    def fits(at: int) -> bool:
        nonlocal miss
        if evaluate.cannot_fit(group[at]):
            return False
        before = evaluate.closest_miss
        evaluate.evaluations += 1  # priced (its memory)
        try:
            memories[at] = evaluate.memory(group[at])
            return True
        except InfeasibleConfigError:
            miss = _closest_miss(evaluate, before, index, miss)
            return False

    checked = 1
    if not fits(len(group) - 1):
        return None, miss, checked
    low, high = start, len(group) - 1  # the first that fits is in group[low : high + 1]; group[high] fits
    while low < high:
        middle = (low + high) // 2
        checked += 1
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    chosen = Candidate(group[low], evaluate(group[low], memories[low]))
    evaluate.evaluations -= 1  # one layout priced: its memory above, now its estimate
    return chosen, miss, checked


_WORK: tuple[SearchSpace, list[list[Block]], Evaluator, float | None, int | None] | None = None
"""What a forked worker inherits: the space, the parts, the evaluator, the deadline and how many
candidates to send back (set in the parent just before forking)."""
_DONE: "multiprocessing.sharedctypes.Synchronized[int] | None" = None


def _scan_part(part: int) -> _Scan:
    assert _WORK is not None and _DONE is not None
    space, parts, evaluate, deadline, keep = _WORK
    done = _DONE

    def count(_done: int, _total: int | None) -> None:
        with done.get_lock():
            done.value += 1

    scan = _scan(space, parts[part], evaluate, deadline, None, count, len(parts[part]), keep)
    if keep is None:
        return scan
    # The merged search's fastest ``keep`` are among each part's (ranked by fastest_first's key, then search order).
    fastest = sorted(
        scan.found, key=lambda item: (item[1].estimate.step_time_s, item[1].estimate.peak_memory_bytes, item[0])
    )
    return replace(scan, found=tuple(fastest[:keep]))


def _parallel_scan(
    space: SearchSpace,
    blocks: list[Block],
    evaluate: Evaluator,
    deadline: float | None,
    processes: int,
    progress: Progress | None,
    keep: int | None,
) -> _Scan:
    """``_scan`` over ``processes`` forked workers, merged as the serial scan would have found it
    (of its found candidates, at least the fastest ``keep``)."""
    global _WORK, _DONE
    parts = _partition(space, blocks, processes)
    context = multiprocessing.get_context("fork")
    _WORK, _DONE = (space, parts, evaluate, deadline, keep), context.Value("q", 0)
    try:
        with ProcessPoolExecutor(max_workers=len(parts), mp_context=context) as pool:
            futures = [pool.submit(_scan_part, part) for part in range(len(parts))]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                if progress is not None:
                    progress(min(_DONE.value, len(blocks)), len(blocks))
            scans = [future.result() for future in futures]
    finally:
        _WORK, _DONE = None, None
    return _merge(scans, evaluate)


def _partition(space: SearchSpace, blocks: list[Block], parts: int) -> list[list[Block]]:
    """Blocks dealt into ``parts`` lists of about equal work, in search order within each list.
    A block's work is taken as its pipeline stages (each is priced) times its micro-batch sizes."""

    def work(block: Block) -> int:
        degrees = block[1]
        return as_int(degrees, "pp") * len(space.choices("micro_batch_size", **degrees))

    dealt: list[list[Block]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for block in sorted(blocks, key=work, reverse=True):  # heaviest first, to the lightest part
        lightest = loads.index(min(loads))
        dealt[lightest].append(block)
        loads[lightest] += work(block)
    for part in dealt:
        part.sort(key=lambda block: block[0])
    return [part for part in dealt if part]


def _merge(scans: list[_Scan], evaluate: Evaluator) -> _Scan:
    """One scan of the workers' scans; the evaluator's counts and closest miss as if it had run them."""
    misses = [scan.miss for scan in scans if scan.miss is not None]
    miss = min(misses, key=lambda item: (item[1].memory.total_bytes, item[0])) if misses else None
    evaluate.evaluations += sum(scan.evaluations for scan in scans)
    evaluate.ruled_out += sum(scan.ruled_out for scan in scans)
    if evaluate.points is not None:
        evaluate.points += [point for scan in scans for point in scan.points]
    if miss is not None:
        evaluate.closest_miss = miss[1]
    return _Scan(
        found=tuple(item for scan in scans for item in scan.found),
        asked=sum(scan.asked for scan in scans),
        complete=all(scan.complete for scan in scans),
        miss=miss,
        evaluations=sum(scan.evaluations for scan in scans),
        ruled_out=sum(scan.ruled_out for scan in scans),
        walked=sum(scan.walked for scan in scans),
        outpaced=sum(scan.outpaced for scan in scans),
    )
