"""Evaluation in one place: every strategy prices a layout through an Evaluator.

An Evaluator checks a layout against the model and cluster, checks memory first (cheap) and
prices time only for layouts that fit within the usable memory (capacity less a stated safety
margin for allocator fragmentation). A layout that does not fit raises InfeasibleConfigError;
the evaluator remembers the closest miss, to explain a search in which nothing fits.

``Evaluator.cannot_fit`` answers cheaper still, and the exhaustive strategy skips what it rules
out: from the model states and workspace alone (``cost_models.memory.stage_memory_floor``),
which layouts differing only in micro-batch size, recompute, sequence parallelism and the kind
of context parallelism share; and
from a layout already found too big with a smaller micro-batch, everything else equal (every
stage's memory is non-decreasing in the micro-batch size b: activations grow with b, and the
micro-batches in flight times b, min(in flight, m) b with m = B / (d b), cannot shrink), unless
gradients replace the activations a larger micro-batch's first backward frees
(``cost_models.memory.gradients_replace_activations``: then it is priced).
"""

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from cost_models.estimate import estimate_unchecked
from cost_models.layout_validity import check_layout
from cost_models.memory import LayoutMemory, all_stage_memory, gradients_replace_activations, stage_memory_floor
from cost_models.offload import host_memory_per_node_bytes
from cost_models.stage_devices import stage_devices
from cost_models.step_floor import floor_factor, floor_of, mean_stage_s
from cost_models.timing import stage_times
from planner.schemas import (
    ClusterProfile,
    Estimate,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    Recompute,
    RoutingStats,
    TrainingSpec,
)
from planner.schemas.errors import DoesNotFitError, InfeasibleConfigError
from planner.schemas.geometry import stage_layers
from planner.schemas.settings import DEFAULT_MEMORY_MARGIN


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutPoint:
    """One evaluated layout as a search plot draws it."""

    step_time_s: float
    peak_memory_bytes: float
    fits: bool
    """Whether its largest rank fits in the usable memory."""


@dataclass(frozen=True, slots=True)
class Miss:
    """The layout that came closest to fitting, with its largest rank's memory."""

    layout: Layout
    memory: MemoryBreakdown


OFFLOAD_STEPS = 20
"""A search offloads optimizer states in twentieths (``Evaluator.least_offload``): at most 5% of
them more on the host than the least that fits."""

FLOOR_FREE_FIELDS = frozenset(
    {
        "micro_batch_size",
        "recompute",
        "recompute_modules",
        "recompute_layers",
        "sequence_parallel",
        "context_parallel_kind",
    }
)
"""Layout fields ``stage_memory_floor`` does not read: layouts differing only in them share a floor."""
_floor_key = operator.attrgetter(*(f.name for f in fields(Layout) if f.name not in FLOOR_FREE_FIELDS))
_batch_free_key = operator.attrgetter(*(f.name for f in fields(Layout) if f.name != "micro_batch_size"))
"""A layout but for its micro-batch size: memory grows with it (module docstring)."""


@dataclass(frozen=True, slots=True)
class SplitCosts:
    """Per-stage cost of a pipeline layout as affine functions of the stage's layer count n:
    time per micro-batch = time_base_s[s] + time_per_layer_s[s] * n, and memory likewise."""

    time_base_s: tuple[float, ...]
    time_per_layer_s: tuple[float, ...]
    memory_base_bytes: tuple[float, ...]
    memory_per_layer_bytes: tuple[float, ...]
    recompute: "RecomputeCosts | None" = None
    """Of a layout without recompute, what each of a stage's layers recomputed in full changes
    (``Layout.recompute_layers``); None: no layer may be."""


@dataclass(frozen=True, slots=True)
class RecomputeCosts:
    """Per stage, what r of its n layers recomputed in full (its first ones) change, affine in r:
    time per micro-batch + time_per_layer_s[s] * r; memory - memory_saved_per_layer_bytes[s] * r,
    + memory_rebuilt_bytes[s] where r = n (the layer a backward rebuilds, beyond the layers kept
    whole, which otherwise hold more)."""

    time_per_layer_s: tuple[float, ...]
    memory_saved_per_layer_bytes: tuple[float, ...]
    memory_rebuilt_bytes: tuple[float, ...]


class Evaluator:
    """Prices layouts of one model on one cluster; counts what it was asked."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        cluster: ClusterProfile,
        *,
        memory_margin: float = DEFAULT_MEMORY_MARGIN,
        routing: RoutingStats | None = None,
        record_points: bool = False,
        admit: Callable[[Layout], None] | None = None,
        partial_recompute: bool = True,
    ) -> None:
        self.model, self.training, self.cluster = model, training, cluster
        self.partial_recompute = partial_recompute
        """Whether a search may offer layouts that recompute some of each stage's layers in full
        (``least_recompute``; the layer split's refiner): not where its constraints leave no
        recompute or full recompute out."""
        self.host_miss: DoesNotFitError | None = None
        """The layout that fit its devices but not its hosts' memory by the least (its message and bytes)."""
        self.offload = False
        """Whether layouts are tried with the least offload that fits (``offers``): set by a search
        in which no layout fits without (``runner.run_search``)."""
        self.optimizer_offload = True
        """In an offload search, whether optimizer states may go to the host (``least_offload``)."""
        self.activation_offload = True
        """In an offload search, whether layers' activations may go to the host (``least_activation_offload``)."""
        self.admit = admit
        """The stack's own refusals: raises InfeasibleConfigError for a layout the framework the
        training is priced for cannot run or express (``flows.search.admission``); None admits all."""
        self.refused = 0
        """Layouts ``admit`` refused."""
        self.first_refusal: str | None = None
        """Why ``admit`` refused the first layout it refused."""
        self.routing = routing
        """A routing trace's statistics: every MoE layer is priced at its busiest rank's load."""
        self.usable_memory_bytes = cluster.pricing_device.memory_bytes * (1.0 - memory_margin)
        """The smallest device's usable memory: every stage's on a cluster of one device type."""
        self._largest_usable_bytes = max(d.memory_bytes for d in cluster.devices) * (1.0 - memory_margin)
        self.memory_margin = memory_margin
        self.evaluations = 0
        self.closest_miss: Miss | None = None
        self.ruled_out = 0
        """Layouts ``cannot_fit`` ruled out."""
        self._floors: dict[object, float] = {}
        self._too_big_from: dict[object, int] = {}
        """Smallest micro-batch size found too big, per layout but for it."""
        self.points: list[LayoutPoint] | None = [] if record_points else None
        """With ``record_points``: every layout evaluated, in order, those that do not fit
        priced in full too (a search plot draws them; it costs their time and every stage's memory)."""

    def memory(self, layout: Layout) -> tuple[MemoryBreakdown, ...]:
        """Per-stage memory of a valid layout; raises InfeasibleConfigError if it cannot run or fit.

        The first stage holds the most micro-batches in flight and the embedding, so it is checked
        alone first: most layouts that do not fit fail there, without pricing the other stages
        (``LayoutMemory`` prices each stage once, what the stages share once).
        """
        check_layout(self.model, self.training, self.cluster, layout)
        if self.admit is not None:
            try:
                self.admit(layout)
            except InfeasibleConfigError as e:
                self.refused += 1
                self.first_refusal = self.first_refusal or str(e)
                raise
        stages = LayoutMemory(self.model, self.training, self.cluster, layout, self.routing)
        usable = self.stage_usable_bytes(layout)
        first = stages.stage(0)
        if first.total_bytes <= usable[0] or self._closer(first):
            memories = (first, *(stages.stage(s) for s in range(1, layout.pipeline_parallel_degree)))
            peak = max(memories, key=lambda mem: mem.total_bytes)
            if all(mem.total_bytes <= cap for mem, cap in zip(memories, usable, strict=True)):
                self._check_host(layout, memories)
                return memories
            if self._closer(peak):
                self.closest_miss = Miss(layout, peak)
        else:
            peak = first
        key, b = _batch_free_key(layout), layout.micro_batch_size
        self._too_big_from[key] = min(b, self._too_big_from.get(key, b))
        raise DoesNotFitError(
            f"{layout.describe()} needs at least {peak.total_bytes / 2**30:.1f} GiB per rank, "
            f"more than the usable {self.usable_memory_bytes / 2**30:.1f} GiB",
            needed_bytes=peak.total_bytes,
            usable_bytes=self.usable_memory_bytes,
        )

    def _check_host(self, layout: Layout, memories: tuple[MemoryBreakdown, ...]) -> None:
        """Raise DoesNotFitError where what ``layout`` offloads (its stages' ``memories``) does not fit
        in a node's host memory, less the margin (``cost_models.offload.host_memory_per_node_bytes``)."""
        host = self.cluster.host
        if host is None:
            return  # an offload without a host is refused by ``check_layout``
        needed = host_memory_per_node_bytes(memories, self.cluster, layout)
        if needed <= 0:
            return
        usable = host.memory_bytes * (1.0 - self.memory_margin)
        if needed > usable:
            why = (
                f"{layout.describe()} needs {needed / 2**30:.1f} GiB of host memory per node for what it "
                f"offloads, more than the usable {usable / 2**30:.1f} GiB"
            )
            miss = DoesNotFitError(why, needed_bytes=needed, usable_bytes=usable)
            if self.host_miss is None or needed < self.host_miss.needed_bytes:
                self.host_miss = miss
            raise miss

    def offers(self, layout: Layout) -> tuple[Layout, ...]:
        """``layout`` as a search tries it: itself, or in an offload search (``offload``) with the
        least optimizer offload that fits (``least_offload``) and, where it may, with the least of
        its first layers' activations offloaded that fits instead (``least_activation_offload``):
        neither dominates, and the search keeps the faster."""
        if not self.offload:
            return (layout,)
        offers = [self.least_offload(layout)] if self.optimizer_offload else []
        activations = self.least_activation_offload(layout) if self.activation_offload else None
        if activations is not None and activations not in offers:
            offers.append(activations)
        return tuple(offers) or (layout,)

    def least_activation_offload(self, layout: Layout) -> Layout | None:
        """``layout`` (no optimizer offload) with the fewest of the model's first layers keeping
        their activations on the host (``Layout.activation_offload_layers``) that its device memory
        says fit; None where it fits without, cannot take one (a pipeline, recompute) or does not
        fit even with every layer but the last offloaded. A layer's share is read off one offloaded
        layer and checked (an MoE model's layers differ)."""
        if not layout.can_offload_activations:
            return None
        kept = replace(layout, optimizer_offload_fraction=0.0, parameter_offload=False, activation_offload_layers=0)
        most = self.model.num_hidden_layers - 1
        one = replace(kept, activation_offload_layers=1)
        try:
            check_layout(self.model, self.training, self.cluster, one)
        except InfeasibleConfigError:
            return None
        (cap,) = self.stage_usable_bytes(kept)
        (without,) = all_stage_memory(self.model, self.training, self.cluster, kept, self.routing)
        (with_one,) = all_stage_memory(self.model, self.training, self.cluster, one, self.routing)
        over, per_layer = without.total_bytes - cap, without.total_bytes - with_one.total_bytes
        if over <= 0 or per_layer <= 0 or over > per_layer * most * 2:
            return None  # fits without, saves nothing, or could not fit with every layer offloaded
        layers = min(most, max(1, math.ceil(over / per_layer - 1e-9)))
        while True:
            offloaded = replace(kept, activation_offload_layers=layers)
            (memory,) = all_stage_memory(self.model, self.training, self.cluster, offloaded, self.routing)
            if memory.total_bytes <= cap:
                break
            if layers == most:
                return None
            layers = min(most, layers + max(1, math.ceil((memory.total_bytes - cap) / per_layer - 1e-9)))
        return offloaded if self.admits(offloaded) else None

    def least_offload(self, layout: Layout) -> Layout:
        """``layout`` with the least share of its optimizer states offloaded, in steps of
        1 / ``OFFLOAD_STEPS``, that its stages' device memory says fit; none where it fits without;
        all where even that does not fit, and under ZeRO-3 the weight and gradient shards too
        (``_parameters_offloaded``; weighed as a miss where that does not fit either). A stage's
        memory is affine in the share (``cost_models.offload``): priced without and with all of it, the
        share is read off. A layout that cannot run is returned as it is (``__call__`` says why)."""
        kept = replace(layout, optimizer_offload_fraction=0.0, parameter_offload=False)
        whole = replace(kept, optimizer_offload_fraction=1.0)
        try:
            check_layout(self.model, self.training, self.cluster, whole)
        except InfeasibleConfigError:
            return layout
        if self.memory_floor_bytes(whole) > self._largest_usable_bytes:
            return self._parameters_offloaded(whole)  # not even the model states fit
        without = all_stage_memory(self.model, self.training, self.cluster, kept, self.routing)
        offloaded = all_stage_memory(self.model, self.training, self.cluster, whole, self.routing)
        share = 0.0
        for cap, a, b in zip(self.stage_usable_bytes(layout), without, offloaded, strict=True):
            over, saved = a.total_bytes - cap, a.total_bytes - b.total_bytes
            if over <= 0:
                continue
            if saved < over:
                return self._parameters_offloaded(whole)
            share = max(share, over / saved)
        if share == 0:
            return kept
        steps = math.ceil(share * OFFLOAD_STEPS - 1e-9)
        return self._admitted(replace(kept, optimizer_offload_fraction=min(1.0, steps / OFFLOAD_STEPS)), whole)

    def _admitted(self, offloaded: Layout, whole: Layout) -> Layout:
        """``offloaded``, or where the training's stack refuses it (``admit``: DeepSpeed offloads a
        share below 1 under ZeRO-3 only) every optimizer state offloaded, ``whole``, which holds less."""
        return offloaded if offloaded == whole or self.admits(offloaded) else whole

    def admits(self, layout: Layout) -> bool:
        """Whether the training's stack runs ``layout`` (``admit``): of an offload the search
        offers, and of what a refiner would change (a device map, an expert placement), asked
        before it is priced; not counted among the refused layouts a search reports."""
        if self.admit is None:
            return True
        try:
            self.admit(layout)
        except InfeasibleConfigError:
            return False
        return True

    def _parameters_offloaded(self, whole: Layout) -> Layout:
        """``whole`` (every optimizer state offloaded, and still too big) with its weight and
        gradient shards on the host too where ZeRO-3 shards them (``Layout.parameter_offload``) and
        the stack runs that, else as it is (a miss, weighed as such)."""
        if not whole.offloads_weights_possible:
            return whole
        return self._admitted(replace(whole, parameter_offload=True), whole)

    def stage_usable_bytes(self, layout: Layout) -> tuple[float, ...]:
        """Each pipeline stage's usable memory: its devices' (the smallest among its ranks' on a
        cluster of mixed device types, ``cost_models.stage_devices``) less the margin."""
        if not self.cluster.has_mixed_devices:
            return (self.usable_memory_bytes,) * layout.pipeline_parallel_degree
        keep = 1.0 - self.memory_margin
        return tuple(d.memory_bytes * keep for d in stage_devices(self.cluster, layout))

    def memory_floor_bytes(self, layout: Layout) -> float:
        """The largest stage's ``stage_memory_floor`` total: a lower bound of the layout's peak memory.

        Memoized over layouts that differ only in ``FLOOR_FREE_FIELDS`` (the inputs are fixed for
        the evaluator's life, and the cost model is pure).
        """
        key = _floor_key(layout)
        floor = self._floors.get(key)
        if floor is None:
            floor = max(
                stage_memory_floor(self.model, self.training, self.cluster, layout, s).total_bytes
                for s in range(layout.pipeline_parallel_degree)
            )
            self._floors[key] = floor
        return floor

    def mean_stage_s(self, layout: Layout) -> float:
        """``cost_models.step_floor.mean_stage_s``: what every layout that differs from ``layout``
        only in recompute, ZeRO, sharding groups and schedule spends at least per stage and micro-batch."""
        return mean_stage_s(self.model, self.training, self.cluster, layout, self.routing)

    def floor_of(self, layout: Layout, mean_s: float) -> float:
        """``cost_models.step_floor.floor_of``: no layout that differs from ``layout`` only in
        recompute, ZeRO and sharding groups steps faster (``mean_s``: its ``mean_stage_s``)."""
        return floor_of(self.training, self.cluster, layout, mean_s)

    def floor_factor(self, layout: Layout) -> float:
        """``cost_models.step_floor.floor_factor``: ``floor_of`` over its ``mean_s``."""
        return floor_factor(self.training, self.cluster, layout)

    def cannot_fit(self, layout: Layout) -> bool:
        """Whether the layout certainly does not fit, and evaluating it would not change the
        closest miss either: the same layout with a smaller micro-batch did not fit (its memory
        was already weighed for the closest miss, and this one needs no less), or its memory
        floor exceeds the usable memory and is no less than the closest miss so far (none yet:
        False). Evaluating such a layout would raise DoesNotFitError and change nothing, so a
        strategy may skip it; this is cheap (look-ups). Counts what it rules out in ``ruled_out``.
        """
        too_big_from = self._too_big_from.get(_batch_free_key(layout))
        if (
            too_big_from is not None
            and layout.micro_batch_size >= too_big_from
            and not gradients_replace_activations(self.training, layout)
        ):
            self.ruled_out += 1
            return True
        if self.closest_miss is None:
            return False
        floor = self.memory_floor_bytes(layout)
        if floor > self._largest_usable_bytes and floor >= self.closest_miss.memory.total_bytes:
            self.ruled_out += 1
            return True
        return False

    def _closer(self, memory: MemoryBreakdown) -> bool:
        return self.closest_miss is None or memory.total_bytes < self.closest_miss.memory.total_bytes

    def __call__(self, layout: Layout, memories: tuple[MemoryBreakdown, ...] | None = None) -> Estimate:
        """The estimate of a layout that fits; raises InfeasibleConfigError otherwise. ``memories``:
        its per-stage memory, where the caller has it from ``memory`` already."""
        self.evaluations += 1
        try:
            memories = self.memory(layout) if memories is None else memories
        except DoesNotFitError:
            if self.points is not None:
                self.record_point(layout)
            raise
        # ``memory`` checked the layout (here or in the caller that passed its ``memories``).
        est = estimate_unchecked(
            self.model, self.training, self.cluster, layout, memories=memories, routing=self.routing
        )
        if self.points is not None:
            self._record(est)
        return est

    def record_point(self, layout: Layout) -> None:
        """Price ``layout`` in full for ``points`` alone (every stage's memory, fitting or not):
        neither an evaluation counted nor a miss weighed, so a search that plots asks and finds
        what one that does not asks and finds. A layout that cannot run is left out."""
        assert self.points is not None
        try:
            whole = all_stage_memory(self.model, self.training, self.cluster, layout, self.routing)
            est = estimate_unchecked(
                self.model, self.training, self.cluster, layout, memories=whole, routing=self.routing
            )
        except InfeasibleConfigError:
            return
        self._record(est)

    def _record(self, est: Estimate) -> None:
        assert self.points is not None
        fits = est.peak_memory_bytes <= self.usable_memory_bytes
        self.points.append(LayoutPoint(step_time_s=est.step_time_s, peak_memory_bytes=est.peak_memory_bytes, fits=fits))

    def least_recompute(self, layout: Layout) -> Layout | None:
        """``layout`` without recompute but for the fewest of each stage's first layers recomputed
        in full (``Layout.recompute_layers``) that its memory says fit, on the layout's split;
        None where it fits without, where it needs every layer recomputed (that is full recompute),
        with several model chunks per stage, where a recomputed layer saves nothing, or where the
        search may not offer it (``partial_recompute``). A stage's memory falls by the same bytes
        with each layer it recomputes (but the last, whose backward rebuilds a layer beside none
        kept whole): priced without and with one, the count is read off; the layout returned may
        still not fit (``__call__`` tells)."""
        if layout.virtual_stages > 1 or not self.partial_recompute:
            return None
        plain = replace(layout, recompute=Recompute.NONE, recompute_layers=None)
        held = stage_layers(self.model, plain)
        try:
            check_layout(self.model, self.training, self.cluster, plain)
        except InfeasibleConfigError:
            return None
        kept = all_stage_memory(self.model, self.training, self.cluster, plain, self.routing)
        one = replace(plain, recompute=Recompute.FULL, recompute_layers=tuple(min(1, n) for n in held))
        saving = all_stage_memory(self.model, self.training, self.cluster, one, self.routing)
        counts = []
        for n, cap, without, with_one in zip(held, self.stage_usable_bytes(plain), kept, saving, strict=True):
            over, saved = without.total_bytes - cap, without.total_bytes - with_one.total_bytes
            if over <= 0:
                counts.append(0)
            elif saved <= 0:
                return None
            else:
                counts.append(min(n, math.ceil(over / saved)))
        if not any(counts) or list(counts) == list(held):
            return None
        return replace(one, recompute_layers=tuple(counts))

    def split_costs(self, layout: Layout, *, partial_recompute: bool = False) -> SplitCosts:
        """Per-stage affine time and memory in the stage's layer count, for the CP-SAT split.

        Every stage's time and memory are affine in its own layer count (its layers repeat the
        same work and activations; the embedding, output layer and buffers are the constant), so
        pricing every stage at 1 and at 2 layers gives both coefficients. One model chunk per
        stage (v = 1) only. With ``partial_recompute``, of ``layout`` without recompute, and what
        each layer recomputed in full changes (``RecomputeCosts``): priced at 2 layers with 1
        recomputed, and at 1 layer recomputed.
        """
        if layout.virtual_stages != 1:
            raise ValueError("split_costs prices one model chunk per stage (virtual_stages = 1)")
        p = layout.pipeline_parallel_degree
        if partial_recompute:
            layout = replace(layout, recompute=Recompute.NONE, recompute_layers=None)
        (t1, m1), (t2, m2) = (self._stage_costs(replace(layout, layer_split=(n,) * p)) for n in (1, 2))
        recompute = None
        if partial_recompute:
            full = replace(layout, recompute=Recompute.FULL, recompute_layers=(1,) * p)
            t21, m21 = self._stage_costs(replace(full, layer_split=(2,) * p))
            m11 = self._stage_memory(replace(full, layer_split=(1,) * p))  # (its time is not needed)
            saved = [b - a for a, b in zip(m21, m2, strict=True)]
            recompute = RecomputeCosts(
                time_per_layer_s=tuple(b - a for a, b in zip(t2, t21, strict=True)),
                memory_saved_per_layer_bytes=tuple(saved),
                memory_rebuilt_bytes=tuple(c - a + x for a, c, x in zip(m1, m11, saved, strict=True)),
            )
        return SplitCosts(
            time_base_s=tuple(2 * a - b for a, b in zip(t1, t2, strict=True)),
            time_per_layer_s=tuple(b - a for a, b in zip(t1, t2, strict=True)),
            memory_base_bytes=tuple(2 * a - b for a, b in zip(m1, m2, strict=True)),
            memory_per_layer_bytes=tuple(b - a for a, b in zip(m1, m2, strict=True)),
            recompute=recompute,
        )

    def _stage_costs(self, trial: Layout) -> tuple[list[float], list[float]]:
        """Each stage's time per micro-batch and memory of ``trial`` (a split of other layer counts
        than the model's: priced per stage, not validated)."""
        times = stage_times(self.model, self.training, self.cluster, trial, routing=self.routing)
        return [t.total_s for t in times], self._stage_memory(trial)

    def _stage_memory(self, trial: Layout) -> list[float]:
        """Each stage's memory of ``trial`` (not validated, as ``_stage_costs``)."""
        return [m.total_bytes for m in all_stage_memory(self.model, self.training, self.cluster, trial, self.routing)]


def dominant_term(memory: MemoryBreakdown) -> tuple[str, float]:
    """The largest term of a memory breakdown's device memory: its name and its bytes (the host's
    offloaded bytes are not the device's)."""
    device = [f for f in fields(memory) if f.name != "host_bytes"]
    name = max(device, key=lambda f: getattr(memory, f.name)).name
    return name.removesuffix("_bytes").replace("_", " "), float(getattr(memory, name))
