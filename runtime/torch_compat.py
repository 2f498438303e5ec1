"""The torch releases the runtime and the profiler support, and the APIs that moved between them.

Clusters run the torch their CUDA stack came with, so the runtime runs on a range of releases
(``SUPPORTED_TORCH``), not one pin. Every difference between those releases that our code meets
is handled here, once; callers use these functions and never test torch's version or attributes
themselves.

What moved between 2.11 and 2.13:
- ``dist.all_gather_single`` / ``dist.reduce_scatter_single`` appeared (2.13), and the older
  ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` became deprecated aliases of them. Same
  arguments, same result (the input, or output, is the concatenation of the group's shards along
  dim 0, in group-rank order), so the older names stand in where the newer are absent.
- ``dist.new_group`` took ``sort_ranks`` (2.13). Before, a group's members are always numbered in
  increasing global rank, so a group that must number them in another order cannot be built:
  ``new_group_in_order`` refuses it with the release named.
- Pipelining's shape check compares strides: a non-contiguous microbatch fails it on 2.11 (the
  data code hands out contiguous batches, so nothing here).

The collectives are looked up on ``torch.distributed`` at each call, by name, so that
``runtime.collective_clock``, which swaps those functions for timed ones, times these calls too.
"""

import inspect
import re
from typing import Any

import torch
import torch.distributed as dist

from planner.schemas.errors import InfeasibleConfigError, PlannerError

SUPPORTED_TORCH = ((2, 11), (2, 13))
"""The oldest and newest torch releases (major, minor), both included, that the runtime and the
profiler run on: the oldest is tested by ``scripts/torch_oldest_venv.sh``, the newest by the suite."""

_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_REDUCE_SCATTER = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
NEW_GROUP_KEEPS_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters
"""Whether this torch's ``new_group`` can number a group's members in an order other than their
global ranks' (its ``sort_ranks`` keyword); without it ``new_group_in_order`` refuses such groups."""


class UnsupportedTorchError(PlannerError):
    """This torch release is outside ``SUPPORTED_TORCH``."""


def _release(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedTorchError(f"cannot read torch's version {version!r}: expected MAJOR.MINOR[.PATCH]")
    return int(found[1]), int(found[2])


def check_torch_version(version: str) -> None:
    """Refuse a torch ``version`` (``torch.__version__``, e.g. "2.13.0+cpu") outside ``SUPPORTED_TORCH``.

    Raises:
        UnsupportedTorchError: naming the version and the supported range.
    """
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_TORCH
    if not (lo_major, lo_minor) <= _release(version) <= (hi_major, hi_minor):
        raise UnsupportedTorchError(
            f"torch {version} is not supported: the runtime and the profiler run on torch "
            f"{lo_major}.{lo_minor} through {hi_major}.{hi_minor}; install one of those (pip install 'torch>="
            f"{lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}')"
        )


def require_supported_torch() -> None:
    """``check_torch_version`` of the torch imported here: called where a job starts, before any work."""
    check_torch_version(str(torch.__version__))


def all_gather_single(output: torch.Tensor, shard: torch.Tensor, *, group: dist.ProcessGroup | None) -> None:
    """Gather the group's equal ``shard``s into ``output``, concatenated along dim 0 in group-rank order."""
    getattr(dist, _ALL_GATHER)(output, shard, group=group)


def reduce_scatter_single(output: torch.Tensor, whole: torch.Tensor, *, group: dist.ProcessGroup | None) -> None:
    """Sum ``whole`` over the group and keep this rank's slice of dim 0 (``whole``'s dim 0 split
    into equal parts, in group-rank order) in ``output``."""
    getattr(dist, _REDUCE_SCATTER)(output, whole, group=group)


def new_group_in_order(ranks: list[int], *, group_desc: str) -> dist.ProcessGroup:
    """A process group whose member ``i`` (its group rank) is ``ranks[i]``, in the order given
    (every rank calls it, for every group, in the same order, as ``dist.new_group`` requires).

    Raises:
        InfeasibleConfigError: ``ranks`` are not increasing and this torch's ``new_group`` cannot
            keep their order (before 2.13 it numbers members by global rank).
    """
    kwargs: dict[str, Any] = {"group_desc": group_desc}
    if NEW_GROUP_KEEPS_ORDER:
        kwargs["sort_ranks"] = False
    elif ranks != sorted(ranks):
        raise InfeasibleConfigError(
            f"the layout's device map puts devices {ranks} on one mesh axis out of increasing order, and "
            f"torch {torch.__version__}'s new_group numbers a group's members by rank (keeping their order needs "
            "torch 2.13); run this plan on torch 2.13, or plan it with the identity device map"
        )
    group: dist.ProcessGroup = dist.new_group(ranks=ranks, **kwargs)
    return group
