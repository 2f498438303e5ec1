"""The tensor-parallel embedding's lookup (``runtime.tensor_parallel.VocabularyLookup``): each rank
differentiates its own rows only. Values against the whole embedding are the parity tests'
(tests/runtime/test_parity.py); here, what one rank allocates, under a fake process group."""

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from runtime.tensor_parallel import VocabularyLookup


class _Largest(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves __init_subclass__ untyped
    """The most elements of any tensor an op returns (a DTensor's: its rank's local tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.elements = max(self.elements, (t.to_local() if isinstance(t, DTensor) else t).numel())
        return out


@pytest.mark.parametrize("rank", [0, 3])
def test_each_rank_differentiates_its_rows_alone(rank: int) -> None:
    # 1,001 rows over 4 ranks: 251, 251, 251 and 248 (torch.chunk's split, as Shard(0) lays them).
    # DTensor's row-wise embedding built the whole (1001, 64) gradient on every rank in the
    # backward (64,064 elements); the lookup's largest tensor is the (8, 32, 64) activation.
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        torch.manual_seed(0)
        embedding = nn.Embedding(1001, 64)
        VocabularyLookup(embedding, mesh).split()
        tokens = torch.randint(0, 1001, (8, 32))
        with _Largest() as largest:
            embedding(tokens).sum().backward()
        rows = 248 if rank == 3 else 251
        assert embedding.weight.grad is not None
        shard_grad = embedding.weight.grad.to_local()
        assert shard_grad.shape == (rows, 64)
        assert largest.elements == 8 * 32 * 64 < 1001 * 64
        # each of the rank's rows gets the count of its tokens (d sum / d row = occurrences)
        first = 251 * rank
        counts = torch.bincount(tokens.reshape(-1), minlength=1001)[first : first + rows].float()
        torch.testing.assert_close(shard_grad[:, 0], counts)
    finally:
        dist.destroy_process_group()
