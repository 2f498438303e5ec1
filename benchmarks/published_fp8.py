"""The FP8 recipe each FP8 row of ``data/published_runs.yaml`` ran, as its source states it.

FP8 rows are not priced yet (``published_h100`` excludes them: only BF16 is modelled); they carry
their recipe so that, once FP8 is priced, each enters with the recipe and stack its source states.
An FP8 row is one whose precision names FP8 (FP8, FP8-CS, FP8-MX, MXFP8, amp_fp8), or a row with
no stated precision that carries a recipe because a footnote ties it to FP8 (the Megatron-Bridge
25.09 DeepSeek-V3 row). Each has two fields:

- ``fp8_recipe``: an ``Fp8Recipe`` value, or null where the source does not state the recipe;
- ``fp8_recipe_as_stated``: the source's words, or what the recipe is inferred from (a release's
  configs, a framework version's only recipe), or why it is null.

A stated recipe must be one the row's stack offers (``Stack.fp8_run``): a source that ran a
recipe its stack lacks is an error to report, not a recipe to force onto the stack.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.schemas import StackName
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.stacks import STACKS

FIELDS = ("fp8_recipe", "fp8_recipe_as_stated")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Statement:
    """What a row's source states of its FP8 recipe."""

    recipe: Fp8Recipe | None
    """None: the source does not state it (the row stays excluded with that reason once FP8 is priced)."""
    as_stated: str
    """The source's words, what the recipe is inferred from, or why it is not stated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Row:
    """One FP8 row's recipe beside its source and the stack that source maps to."""

    id: int
    source: str
    stack: StackName
    recipe: Fp8Recipe | None
    as_stated: str


def is_fp8(row: Mapping[str, Any]) -> bool:
    """Whether the row ran FP8: its precision names FP8, or it states no precision but carries a
    recipe (a footnote ties it to FP8)."""
    precision = row["precision"]
    if precision is None:
        return "fp8_recipe" in row
    return "FP8" in str(precision).upper()


def read_fp8(row: Mapping[str, Any], stack: StackName) -> Fp8Statement | None:
    """The row's FP8 statement, checked against its stack; None for a row that did not run FP8.

    Raises ValueError (naming the row) for an FP8 row without both fields, a BF16 row with them,
    an unknown recipe, a recipe ``stack`` does not offer, or a null recipe without a reason."""
    where = f"published row {row['id']}"
    present = [key for key in FIELDS if key in row]
    if not is_fp8(row):
        if present:
            raise ValueError(
                f"{where}: precision {row['precision']!r} is not FP8 but the row sets {', '.join(present)}"
            )
        return None
    if len(present) != len(FIELDS):
        raise ValueError(f"{where}: FP8 precision {row['precision']!r} needs both {' and '.join(FIELDS)}")
    as_stated = row["fp8_recipe_as_stated"]
    if not isinstance(as_stated, str) or not as_stated.strip():
        raise ValueError(f"{where}: fp8_recipe_as_stated must say where the recipe (or its absence) comes from")
    if row["fp8_recipe"] is None:
        return Fp8Statement(recipe=None, as_stated=as_stated)
    try:
        recipe = Fp8Recipe(row["fp8_recipe"])
    except ValueError:
        known = ", ".join(r.value for r in Fp8Recipe)
        raise ValueError(f"{where}: unknown fp8_recipe {row['fp8_recipe']!r} (known: {known})") from None
    try:
        STACKS[stack].fp8_run(recipe)
    except SchemaError as error:
        raise ValueError(f"{where}: {error}") from None
    return Fp8Statement(recipe=recipe, as_stated=as_stated)
