"""What one MLP's backward holds at once in the runtime's kernels, beside the activations the
layer keeps: the tensor counts ``cost_models.activations.MLP_BACKWARD_TENSORS`` prices (a
pipeline stage's peak falls in a backward, with every in-flight micro-batch's activations held)."""

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cost_models.activations import MLP_BACKWARD_TENSORS, mlp_backward_bytes
from planner.files.models import load_model
from planner.schemas import Activation, DType
from runtime.mlp import MLP


class _NewTensorPeak(TorchDispatchMode):
    """The largest number of bytes, at any moment, of storages created inside the mode and still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._count(tensor.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._seen:
            return
        self._seen.add(key)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self.live_bytes -= size
        self._seen.discard(key)


@pytest.mark.parametrize("activation", [Activation.SWIGLU, Activation.GEGLU, Activation.GELU])
def test_an_mlp_backward_holds_the_priced_tensors_of_its_width(activation: Activation) -> None:
    # A narrow hidden size (64) against a wide MLP (14,336) and many tokens: the weights' and the
    # input's gradients are 1/224 of one intermediate tensor each, so the count reads off directly.
    model = load_model("llama3-8b").model_copy(update={"hidden_act": activation, "hidden_size": 64})
    tokens = 2048
    mlp = MLP(model).to(torch.bfloat16)
    x = torch.randn(tokens, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    out = mlp(x)
    grad = torch.randn_like(out)
    peak = _NewTensorPeak()
    with peak:
        out.backward(grad)
    intermediate = tokens * model.ffn_size * 2
    priced = mlp_backward_bytes(model, tokens * model.ffn_size, DType.BF16)
    assert priced == MLP_BACKWARD_TENSORS[activation] * intermediate
    assert priced <= peak.peak_bytes <= priced + 0.1 * intermediate, (
        f"{activation}: traced {peak.peak_bytes / intermediate:.3f} intermediate tensors, priced "
        f"{MLP_BACKWARD_TENSORS[activation]}"
    )
