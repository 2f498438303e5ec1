"""Searching layouts: the space declared once (``axes.AXES``), one evaluator, strategies behind
one interface (``strategy``), and refiners that improve the finalists (``refiner``; the CP-SAT
layer split is ``layer_split.LayerSplitRefiner``).

Nothing here imports torch (a test checks it).
"""

from planner.schemas.errors import SchemaError
from planner.schemas.settings import StrategyName
from planner.search_engine.exhaustive import ExhaustiveSearch
from planner.search_engine.layer_split import LayerSplitRefiner
from planner.search_engine.optuna_search import OptunaSearch
from planner.search_engine.refiner import Refiner
from planner.search_engine.strategy import SearchStrategy


def make_strategy(name: StrategyName | str, *, storage: str | None = None) -> SearchStrategy:
    """The strategy called ``name`` (a StrategyName or its value, e.g. "optuna"); ``storage`` is
    Optuna's study storage URL (None: in memory).

    Raises:
        SchemaError: ``name`` names no strategy.
    """
    if name not in tuple(StrategyName):
        raise SchemaError(f"strategy {name!r} is not one of: {', '.join(StrategyName)}; pass one of those names")
    if StrategyName(name) is StrategyName.OPTUNA:
        return OptunaSearch(storage=storage)
    return ExhaustiveSearch()


__all__ = [
    "ExhaustiveSearch",
    "LayerSplitRefiner",
    "OptunaSearch",
    "Refiner",
    "SearchStrategy",
    "StrategyName",
    "make_strategy",
]
