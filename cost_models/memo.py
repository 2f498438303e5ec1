"""A bounded memo for the cost models' pure functions, keyed on what each reads.

A search prices tens of thousands of layouts that share a few values of what a function reads
(a layer's time, a stage's collectives). Those inputs include a profile object hashed by
identity rather than by its many fields; the entry holds that object, so its id cannot be reused
by another object while the entry lives, and a hit checks that it is the same object. The memo
empties itself when full, which bounds its memory over a long session.
"""

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class HeldMemo(Generic[V]):
    """Values by (held object, key); at most ``limit`` entries."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[tuple[object, ...], tuple[object, V]] = {}
        _EVERY.add(self)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def get(self, held: object, key: tuple[object, ...], compute: Callable[[], V]) -> V:
        """The value of ``key`` for ``held``, computed by ``compute`` once."""
        full = (id(held), *key)
        hit = self._entries.get(full)
        if hit is not None and hit[0] is held:
            return hit[1]
        value = compute()
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[full] = (held, value)
        return value


_EVERY: "weakref.WeakSet[HeldMemo[Any]]" = weakref.WeakSet()


def clear_every_memo() -> None:
    """Empty every ``HeldMemo``: what a test that compares memoized pricing with fresh pricing
    starts each fresh estimate from."""
    for memo in list(_EVERY):
        memo.clear()
