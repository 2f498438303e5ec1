"""The FP8 rows of benchmarks/data/published_runs.yaml carry the recipe their source states, one
their source's stack offers, and are priced with it; a row whose source states no recipe stays
excluded for that reason."""

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from published_fp8 import read_fp8
from published_h100 import DATA, SOURCE_STACKS, fp8_rows, load_runs

from planner.schemas import StackName
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.stacks import STACKS

FP8_REASON = "FP8 recipe not stated by the source"
UNSTATED_REASON = "precision not stated (Megatron-Bridge 25.09 footnote implies FP8)"


@pytest.fixture(scope="module")
def raw_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = yaml.safe_load(DATA.read_text())
    return rows


def test_every_fp8_row_is_priced_with_its_recipe_or_excluded_for_want_of_one(raw_rows: list[dict[str, Any]]) -> None:
    runs, excluded = load_runs()
    listed = {r.id: r.recipe for r in fp8_rows()}
    assert len(listed) == 46  # 41 FP8 rows, the 25.09 DeepSeek-V3 row, and torchtitan's 4 rowwise rows 112-115
    by_precision = {e.id for e in excluded if e.reason in (FP8_REASON, UNSTATED_REASON)}
    assert by_precision == {i for i, recipe in listed.items() if recipe is None}
    priced = {r.id for r in runs} | {e.id for e in excluded}
    assert set(listed) <= priced
    for row in raw_rows:
        if row["id"] in listed:
            assert "fp8_recipe" in row and "fp8_recipe_as_stated" in row, row["id"]


def test_each_stated_recipe_is_one_its_sources_stack_offers() -> None:
    for r in fp8_rows():
        assert r.stack is SOURCE_STACKS[r.source].stack
        if r.recipe is not None:
            assert isinstance(r.recipe, Fp8Recipe)
            assert r.recipe in STACKS[r.stack].fp8_recipes, (r.id, r.recipe, r.stack)
        assert r.as_stated.strip(), r.id


def test_the_recipes_are_the_ones_the_sources_name() -> None:
    stated = {r.id: r.recipe for r in fp8_rows()}
    print(f"\nFP8 rows: {len(stated)}, with a stated recipe: {sum(v is not None for v in stated.values())}")
    assert stated[10] is Fp8Recipe.TENSORWISE  # Bridge 25.11 'FP8-CS'
    assert stated[25] is Fp8Recipe.MXFP8  # Bridge 25.11 'FP8-MX'
    assert stated[21] is None  # 25.09: no precision column
    assert stated[50] is Fp8Recipe.TENSORWISE  # torchtitan Dec-2024: dynamic tensorwise only
    assert stated[112] is Fp8Recipe.ROWWISE  # torchtitan async-TP 'float8 rowwise'
    assert stated[97] is Fp8Recipe.DELAYED  # llm-foundry amp_fp8: Composer's DelayedScaling
    assert [i for i, v in stated.items() if v is None] == [21]


def test_the_priced_fp8_rows_carry_the_recipe_their_source_states() -> None:
    runs, _ = load_runs()
    listed = {r.id: r.recipe for r in fp8_rows()}
    for run in runs:
        assert run.fp8_recipe == listed.get(run.id), run.id
        assert (run.fp8_recipe_as_stated is None) == (run.id not in listed), run.id
    # 5 H100 rows counted, 8 flagged, 5 B200 and 4 GB200 rows; the rest excluded for other reasons
    # (B200 row 28: the expert all-to-all overlap its workload config runs)
    assert sum(r.fp8_recipe is not None for r in runs) == 22


def _row(**fields: Any) -> dict[str, Any]:
    return {"id": 999, "precision": "FP8", "fp8_recipe": "tensorwise", "fp8_recipe_as_stated": "the table"} | fields


@pytest.mark.parametrize(
    ("row", "stack", "message"),
    [
        (_row(fp8_recipe="mxfp8"), StackName.LLM_FOUNDRY, "offers delayed"),
        (_row(fp8_recipe="subchannel"), StackName.MEGATRON_BRIDGE, "unknown fp8_recipe"),
        (_row(fp8_recipe=None, fp8_recipe_as_stated=" "), StackName.MEGATRON_BRIDGE, "must say where"),
        ({"id": 999, "precision": "FP8-CS", "fp8_recipe": "tensorwise"}, StackName.MEGATRON_BRIDGE, "needs both"),
        (_row(precision="BF16"), StackName.MEGATRON_BRIDGE, "is not FP8"),
    ],
)
def test_a_bad_fp8_statement_is_refused_naming_the_row(row: dict[str, Any], stack: StackName, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        read_fp8(row, stack)
    assert "published row 999" in str(caught.value)


def test_a_null_precision_row_without_a_recipe_is_not_fp8() -> None:
    assert read_fp8({"id": 1, "precision": None}, StackName.MEGATRON_LM) is None
    unstated = read_fp8(
        {"id": 1, "precision": None, "fp8_recipe": None, "fp8_recipe_as_stated": "no column"}, StackName.MEGATRON_BRIDGE
    )
    assert unstated is not None and unstated.recipe is None
