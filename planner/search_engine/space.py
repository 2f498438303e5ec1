"""The search space: its inputs (``space_inputs.SpaceInputs``) and the candidates they allow,
enumerated over the axes declared once (``axes.AXES``, where each axis's validity rule and the
order of the search are written): every valid assignment of values to the axes, the layout each
makes, and the candidates grouped by everything but recompute (the exhaustive strategy's pruning
relies on that grouping).
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import overload

from planner.schemas import Layout
from planner.schemas.choices import Choice, RecomputeChoice
from planner.schemas.errors import SchemaError
from planner.search_engine.axes import AXES, DEGREE_AXES, Assignment, Axis
from planner.search_engine.space_inputs import SpaceInputs


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace(SpaceInputs):
    """The choices a search may make for one model, training setup and cluster size (its fields:
    ``SpaceInputs``), and the candidate layouts they allow."""

    @property
    def axes(self) -> tuple[Axis, ...]:
        """The axes of the search (``AXES``)."""
        return AXES

    def axis(self, name: str) -> Axis:
        """The axis called ``name``; raises KeyError naming the axes there are."""
        for axis in AXES:
            if axis.name == name:
                return axis
        raise KeyError(f"no axis {name!r}; the axes are {', '.join(a.name for a in AXES)}")

    def constrained(self, constraints: Mapping[str, Iterable[Choice]]) -> "SearchSpace":
        """This space with ``constraints`` (axis name -> allowed values) added.

        Raises:
            SchemaError: an unknown axis, or an axis given no value.
        """
        names = [axis.name for axis in AXES]
        merged = dict(self.constraints)
        for name, values in constraints.items():
            if name not in names:
                raise SchemaError(f"no search axis {name!r} to constrain; the axes are {', '.join(names)}")
            allowed = frozenset(values)
            if not allowed:
                raise SchemaError(f"the constraint on {name} allows no value; give at least one")
            merged[name] = allowed
        return replace(self, constraints=tuple(sorted(merged.items())))

    def choices(self, name: str, **chosen: Choice) -> Sequence[Choice]:
        """The valid values of axis ``name`` given the values of the axes it depends on."""
        return self.axis(name).choices(self, chosen)

    def assignments(
        self, axes: Sequence[Axis], within: Assignment | None = None, memo: "ChoiceMemo | None" = None
    ) -> Iterator[dict[str, Choice]]:
        """Every valid combination of values of ``axes`` (a prefix of ``AXES``), in search order;
        with ``within`` (values of a shorter prefix), only those that extend it. ``memo``: the
        choices already listed (``ChoiceMemo``), shared with the caller; None starts one."""
        start = dict(within or {})
        memo = ChoiceMemo(self) if memo is None else memo

        def walk(i: int, chosen: dict[str, Choice]) -> Iterator[dict[str, Choice]]:
            if i == len(axes):
                yield chosen
                return
            axis = axes[i]
            for value in memo.choices(axis, chosen):
                yield from walk(i + 1, {**chosen, axis.name: value})

        return walk(len(start), start)

    def layout(self, chosen: Assignment) -> Layout:
        """The layout (even layer split) of a value for every axis."""
        fields: dict[str, object] = {axis.field: chosen[axis.name] for axis in AXES}
        recompute = fields["recompute"]
        if isinstance(recompute, RecomputeChoice):  # the recompute axis sets two fields
            fields["recompute"], fields["recompute_modules"] = recompute.recompute, recompute.modules
        return Layout(**fields)  # type: ignore[arg-type]

    def blocks(self) -> Iterator[Assignment]:
        """The values of the parallel degrees (``DEGREE_AXES``) of every candidate, in search
        order: the candidates that share them are contiguous in ``groups``."""
        return self.assignments(AXES[: len(DEGREE_AXES)])

    def groups(self, block: Assignment | None = None) -> Iterator[tuple[Layout, ...]]:
        """Candidates grouped by everything but recompute; each group is in ``recompute`` order.
        With ``block`` (one of ``blocks``), only the groups with those degrees.

        Within a group the layouts differ only in recomputation, which adds time and saves memory,
        so the first that fits dominates the rest.
        """
        for group in self.lazy_groups(block):
            yield tuple(group)

    def lazy_groups(self, block: Assignment | None = None) -> Iterator["LayoutGroup"]:
        """``groups``, each building a layout only when it is read: a strategy that stops at a
        group's first fitting layout builds no more (an MoE model's groups hold four)."""
        *outer, last = AXES
        memo = ChoiceMemo(self)
        for chosen in self.assignments(outer, block, memo):
            values = memo.choices(last, chosen)
            if values:
                yield LayoutGroup(self, chosen, values)

    def candidates(self) -> Iterator[Layout]:
        """Every candidate layout (even layer split)."""
        for group in self.groups():
            yield from group

    def size(self) -> int:
        """Number of candidates (counted from the choices, without building the layouts)."""
        *outer, last = AXES
        memo = ChoiceMemo(self)
        return sum(len(memo.choices(last, chosen)) for chosen in self.assignments(outer, memo=memo))


class ChoiceMemo:
    """Each axis's valid values by the values of the axes it depends on, listed once per walk of
    a space: a rule sees only those (``Axis.depends_on``) and the space, so the values are the
    same wherever they recur (the recompute axis depends on none: one list for the whole walk)."""

    __slots__ = ("_listed", "_space")

    def __init__(self, space: SpaceInputs) -> None:
        self._space = space
        self._listed: dict[tuple[object, ...], Sequence[Choice]] = {}

    def choices(self, axis: Axis, chosen: Assignment) -> Sequence[Choice]:
        """``axis.choices`` for ``chosen`` (which holds the axes it depends on)."""
        key = (axis.name, *(chosen[name] for name in axis.depends_on))
        values = self._listed.get(key)
        if values is None:
            values = self._listed[key] = axis.choices(self._space, chosen)
        return values


class LayoutGroup(Sequence[Layout]):
    """One of ``SearchSpace.groups`` whose layouts are built when first read (``lazy_groups``)."""

    __slots__ = ("_built", "_chosen", "_space", "_values")

    def __init__(self, space: SearchSpace, chosen: Assignment, values: Sequence[Choice]) -> None:
        self._space, self._chosen, self._values = space, chosen, values
        self._built: dict[int, Layout] = {}

    def __len__(self) -> int:
        return len(self._values)

    @property
    def chosen(self) -> Assignment:
        """The values of every axis but the last (recompute), which the group's layouts share."""
        return self._chosen

    @overload
    def __getitem__(self, index: int) -> Layout: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Layout]: ...

    def __getitem__(self, index: int | slice) -> Layout | Sequence[Layout]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        layout = self._built.get(index)
        if layout is None:
            layout = self._built[index] = self._space.layout({**self._chosen, AXES[-1].name: self._values[index]})
        return layout
