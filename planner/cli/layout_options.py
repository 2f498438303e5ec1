"""estimate's options for the layout fields a search chooses beyond the degrees and the schedule:
the sharding group (HSDP), ZeRO++'s secondary partition (hpZ), the expert placement, the device
map, and the routing trace the search priced a placement on. With them every plan a search
returns can be given to ``planner estimate`` field by field and priced again by hand; each also
overrides its field of ``--plan``.

A value that means a field's default is spelled out (``--secondary-partition-size 0``,
``--expert-placement contiguous``, ``--device-map identity``, ``--layer-split even``), so that
an option can also take a plan's choice back to the default."""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from planner import api
from planner.files.layout_parts import DEVICE_MAP_EXAMPLE, PLACEMENT_EXAMPLE
from planner.schemas.device_map import IDENTITY
from planner.schemas.errors import PlannerError, SchemaError

CONTIGUOUS = "contiguous"
"""--expert-placement's word for the default placement: expert e of E on rank e // (E / ep)."""
IDENTITY_MAP = "identity"
"""--device-map's word for the default map: rank r on device r."""
EVEN_SPLIT = "even"
"""--layer-split's word for the default split: layers spread evenly over the model chunks."""

FILE_OPTIONS = {"expert_placement": "--expert-placement", "device_map": "--device-map"}
"""The layout options that read a file: option parameter (the Layout field of the same name) -> flag."""

ShardingGroupSizeOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Ranks of a ZeRO sharding group: ZeRO shards within groups of this many consecutive data-parallel "
        "ranks and replicates across the groups, whose gradients are then all-reduced (HSDP; FSDP2 on a "
        "(replicate, shard) mesh). Needs --zero-stage 1-3 and divides dp x cp; e.g. 8 to shard within a node of 8 "
        "[default: dp x cp, the whole data-parallel group].",
    ),
]
SecondaryPartitionSizeOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="ZeRO-3: ranks each unit's weights stay sharded over after the forward, and the backward gathers them "
        "from (ZeRO++'s hierarchical partition, hpZ; FSDP2's reshard_after_forward=<int>). Divides the sharding "
        "group and is smaller, no pipeline; e.g. 8 to gather within a node of 8; 0 for none "
        "[default: 0, the backward gathers over the sharding group].",
    ),
]
ExpertPlacementOpt = Annotated[
    str | None,
    typer.Option(
        metavar="FILE",
        help="MoE: a JSON file of the experts each expert-parallel rank hosts in each MoE layer, as a plan stores "
        f"it under layout.expert_placement, e.g. {PLACEMENT_EXAMPLE}; or a plan file, whose layout's is taken; "
        f"{CONTIGUOUS!r} for the default [default: {CONTIGUOUS}, expert e of E on rank e // (E / ep)].",
    ),
]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option(
        metavar="FILE",
        help="A JSON file of the device that runs each rank (devices numbered node by node, as torchrun numbers "
        f"its processes), as a plan stores it under layout.device_map, e.g. {DEVICE_MAP_EXAMPLE}; or a plan file, "
        f"whose layout's is taken; {IDENTITY_MAP!r} for the default [default: {IDENTITY_MAP}, rank r on device r].",
    ),
]
RoutingTraceOpt = Annotated[
    Path | None,
    typer.Option(
        help="A routing trace (.npz) of the model: price each MoE layer at its busiest expert-parallel rank under "
        "the layout's expert placement, as `planner search --routing-trace` priced its plans (e.g. --routing-trace "
        "routing.npz) [default: uniform routing].",
    ),
]


def parse_layout_parts(fields: dict[str, Any]) -> None:
    """Turn the text of the options above (and --layer-split's word) among ``fields`` (Layout
    fields, as ``options.layout_fields`` gathers them) into the values a Layout holds, in place.

    Raises:
        SchemaError: a file that cannot be read or holds no valid placement or map; the message
            names the option, the file and the form expected.
    """
    if fields.get("secondary_partition_size") == 0:
        fields["secondary_partition_size"] = None
    text = fields.get("expert_placement")
    if text is not None:
        fields["expert_placement"] = None if text == CONTIGUOUS else _read("expert_placement", text)
    text = fields.get("device_map")
    if text is not None:
        fields["device_map"] = IDENTITY if text == IDENTITY_MAP else _read("device_map", text)


def _read(name: str, text: str) -> Any:
    loader = api.load_expert_placement if name == "expert_placement" else api.load_device_map
    try:
        return loader(text)
    except SchemaError as e:
        raise SchemaError(f"{FILE_OPTIONS[name]} {e}") from e


@contextmanager
def naming_layout_files(options: Mapping[str, Any]) -> Iterator[None]:
    """Within: an error about the expert placement or the device map that a file gave (one that does
    not fit the layout's degrees or the model's experts) names the option and the file."""
    try:
        yield
    except PlannerError as e:
        for name, flag in FILE_OPTIONS.items():
            text = options.get(name)
            if text is not None and text not in (CONTIGUOUS, IDENTITY_MAP) and str(e).startswith(name):
                raise SchemaError(f"{flag} {text}: {e}") from e
        raise
