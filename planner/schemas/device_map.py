"""DeviceMap: which device of which node runs each rank of a layout.

Devices are numbered node by node, as torchrun numbers its processes: device ``g`` is local
device ``g % devices_per_node`` of node ``g // devices_per_node``. A layout's ranks are the
coordinates of its mesh (``schemas.geometry``); the map says where each one runs. The identity
(rank ``r`` on device ``r``) is the default and is stored as an empty tuple, so that a plan for
10,000 devices stays small unless a mapping was chosen.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from planner.schemas.errors import SchemaError


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMap:
    """Rank -> device; the identity when ``devices`` is empty."""

    devices: tuple[int, ...] = ()
    """``devices[r]`` is the device that runs rank ``r`` (a permutation of 0..world-1), or empty."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.devices and sorted(self.devices) != list(range(len(self.devices))):
            raise SchemaError(
                f"device_map {list(self.devices)[:16]}{' ...' if len(self.devices) > 16 else ''} must name every "
                f"device 0..{len(self.devices) - 1} exactly once"
            )
        if self.devices == tuple(range(len(self.devices))):
            object.__setattr__(self, "devices", ())  # one spelling of the identity

    @property
    def is_identity(self) -> bool:
        """Whether rank r runs on device r."""
        return not self.devices

    def device_of(self, rank: int) -> int:
        """The device (numbered node by node) that runs ``rank``."""
        return self.devices[rank] if self.devices else rank

    def node_of(self, rank: int, devices_per_node: int) -> int:
        """The node that runs ``rank``."""
        return self.device_of(rank) // devices_per_node

    def check(self, world_size: int) -> None:
        """Raise SchemaError unless the map covers exactly ``world_size`` ranks."""
        if self.devices and len(self.devices) != world_size:
            raise SchemaError(
                f"device_map names {len(self.devices)} devices, but the layout has {world_size} ranks; "
                "give one device per rank, or none for the identity"
            )


IDENTITY = DeviceMap()
"""Rank r on device r (immutable, so every layout without a map shares it)."""


def node_numbers(devices: Iterable[int], devices_per_node: int) -> tuple[int, ...]:
    """The node of each of ``devices``, nodes numbered from 0 in the order the devices meet them
    (a placement cares which ranks share a node, not which node it is)."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(device // devices_per_node, len(first)) for device in devices)
