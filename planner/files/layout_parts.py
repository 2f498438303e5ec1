"""Reading the parts of a layout that a plan stores as JSON objects from files of their own: an
expert placement and a device map, each in the very form a plan file holds it under ``layout``
(or a whole plan file, whose layout's part is taken). So any layout a search chose can be given
to ``planner estimate`` field by field, and priced again by hand.

- expert placement: ``{"slots": [[[0, 1], [2, 3]], ...]}``: per MoE layer, per expert-parallel
  rank, the experts the rank hosts (``ExpertPlacement``);
- device map: ``{"devices": [8, 9, ..., 0, 1, ...]}``: the device that runs each rank
  (``DeviceMap``; an empty list is the identity).
"""

from collections.abc import Mapping
from pathlib import Path

from planner.files.reading import read_mapping_file
from planner.schemas import DeviceMap
from planner.schemas.errors import SchemaError
from planner.schemas.routing import ExpertPlacement

PLACEMENT_EXAMPLE = '{"slots": [[[0, 1], [2, 3]]]} (MoE layer 0: rank 0 hosts experts 0 and 1, rank 1 experts 2 and 3)'
DEVICE_MAP_EXAMPLE = '{"devices": [4, 5, 6, 7, 0, 1, 2, 3]} (ranks 0-3 on devices 4-7, ranks 4-7 on devices 0-3)'


def load_expert_placement(path: Path | str) -> ExpertPlacement | None:
    """The expert placement in ``path``: its ``{"slots": ...}`` object, or a plan file's (None where
    the plan keeps the default, experts in contiguous blocks).

    Args:
        path: a placement file or a plan file.

    Returns:
        The placement, or None where a plan keeps the default.

    Raises:
        SchemaError: the file cannot be read, is not JSON, or holds no valid placement; the
            message names the file and the form expected.
    """
    where = Path(path)
    part = _part(where, "expert_placement", "slots", PLACEMENT_EXAMPLE)
    if part is None:
        return None
    try:
        return ExpertPlacement(slots=part["slots"])  # type: ignore[arg-type]  # checked by its own __post_init__
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from e
    except TypeError as e:  # a number where a list belongs
        raise SchemaError(
            f"{where}: slots must hold per MoE layer, per expert-parallel rank, a list of expert ids, e.g. "
            f"{PLACEMENT_EXAMPLE}"
        ) from e


def load_device_map(path: Path | str) -> DeviceMap:
    """The device map in ``path``: its ``{"devices": ...}`` object, or a plan file's.

    Args:
        path: a device-map file or a plan file.

    Returns:
        The device map.

    Raises:
        SchemaError: the file cannot be read, is not JSON, or holds no valid map; the message names
            the file and the form expected.
    """
    where = Path(path)
    part = _part(where, "device_map", "devices", DEVICE_MAP_EXAMPLE)
    if part is None:  # a plan's map is never null; a hand-edited one may be
        raise SchemaError(f"{where}: the plan's layout has no device_map; give a map, e.g. {DEVICE_MAP_EXAMPLE}")
    devices = part["devices"]
    if not isinstance(devices, list) or any(not isinstance(d, int) or isinstance(d, bool) for d in devices):
        raise SchemaError(f"{where}: devices must be a list of whole device numbers, e.g. {DEVICE_MAP_EXAMPLE}")
    try:
        return DeviceMap(devices=tuple(devices))
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from e


def _part(where: Path, field: str, key: str, example: str) -> Mapping[str, object] | None:
    """The ``{key: ...}`` object in ``where``, or a plan file's ``layout[field]`` (None if null)."""
    if not where.is_file():
        missing = "is a folder" if where.is_dir() else "does not exist"
        raise SchemaError(f"{where} {missing}; give a JSON file holding {example}")
    data = read_mapping_file(where)
    layout = data.get("layout")
    if "schema_version" in data and isinstance(layout, Mapping):  # a plan file
        part = layout.get(field)
        if part is None:
            return None
        data = part if isinstance(part, Mapping) else {}
    if set(data) != {key}:
        raise SchemaError(
            f"{where}: found keys {sorted(data)}; give a JSON object with the one key {key!r}, as a plan stores it "
            f"under layout.{field}, e.g. {example}"
        )
    return data
