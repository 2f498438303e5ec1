"""Which of the planner's files a document is, so that one given where another belongs is named
("plan.json is a plan, not a model config: give it as ...") instead of failing that file's
schema key by key.

A document's kind is read from the keys only that kind has: a plan's ``layout`` and ``estimate``,
a cluster profile's ``devices_per_node`` and ``intra_node_links``, a run report's ``plan_sha256``,
a model config's ``hidden_size`` (or ``d_model``) and ``num_hidden_layers``.
"""

from collections.abc import Mapping

from planner.schemas.errors import SchemaError

_MARKS: dict[str, tuple[frozenset[str], ...]] = {
    "plan": (frozenset({"layout", "estimate", "training"}),),
    "cluster profile": (frozenset({"devices_per_node", "intra_node_links"}),),
    "run report": (frozenset({"plan_sha256", "world_size"}),),
    "model config": (frozenset({"hidden_size", "num_hidden_layers"}), frozenset({"d_model", "n_layers"})),
}

_WHERE_IT_GOES = {
    "plan": "give it where a plan goes (planner explain PLAN, estimate --plan PLAN)",
    "cluster profile": "give it as --cluster (-c)",
    "run report": "it is what planner run --report writes; tune reads it from its own trials",
    "model config": "give it as --model (-m)",
}


def file_kind(document: object) -> str | None:
    """The kind of planner file ``document`` (a parsed JSON or YAML file) is, or None if none."""
    if not isinstance(document, Mapping):
        return None
    keys = set(document)
    return next((kind for kind, marks in _MARKS.items() if any(mark <= keys for mark in marks)), None)


def refuse_other_kind(document: object, where: str, wanted: str) -> None:
    """Raise if ``document``, read from ``where`` as a ``wanted`` file, is another kind of planner file.

    Raises:
        SchemaError: one line naming both kinds and where the file goes.
    """
    kind = file_kind(document)
    if kind is not None and kind != wanted:
        raise SchemaError(f"{where} is a {kind}, not a {wanted}: {_WHERE_IT_GOES[kind]}")
