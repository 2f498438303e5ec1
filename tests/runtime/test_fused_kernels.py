"""runtime.kernels and runtime.model.add_rows compute what torch's composites compute and keep
only what fused kernels keep."""

import torch
import torch.nn.functional as F
from torch import nn

from planner.schemas import Activation, ModelSpec
from runtime.kernels import RMSNorm, geglu, swiglu
from runtime.mlp import MLP, add_rows


def test_rms_norm_matches_torch_in_value_and_gradient() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    ours, ref = RMSNorm(16).double(), nn.RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16, dtype=torch.float64))
        ref.weight.copy_(ours.weight)
    grad = torch.randn(3, 5, 16, dtype=torch.float64)
    (gx,) = torch.autograd.grad(ours(x), x, grad)
    (gx_ref,) = torch.autograd.grad(ref(x), x, grad)
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(gx, gx_ref)
    ours(x).backward(grad)
    ref(x).backward(grad)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)


def test_swiglu_matches_torch_in_value_and_gradient() -> None:
    torch.manual_seed(0)
    gate = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 7, dtype=torch.float64)
    ours = torch.autograd.grad(swiglu(gate, up), (gate, up), grad)
    ref = torch.autograd.grad(F.silu(gate) * up, (gate, up), grad)
    torch.testing.assert_close(swiglu(gate, up), F.silu(gate) * up)
    torch.testing.assert_close(ours, ref)


def test_geglu_matches_torch_in_value_and_gradient_keeping_only_its_inputs() -> None:
    torch.manual_seed(0)
    gate = torch.randn(4, 7, dtype=torch.float64, requires_grad=True) * 3
    up = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 7, dtype=torch.float64)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = geglu(gate, up)
    ref_out = F.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(
        torch.autograd.grad(out, (gate, up), grad), torch.autograd.grad(ref_out, (gate, up), grad)
    )
    assert len(saved) == 2  # gate and up, not GELU(gate)


def test_a_geglu_model_runs_gelu_on_its_gate() -> None:
    torch.manual_seed(0)
    spec = ModelSpec(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=16, hidden_act=Activation.GEGLU
    )
    mlp = MLP(spec).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    assert mlp.gate is not None
    torch.testing.assert_close(mlp(x), mlp.down(F.gelu(mlp.gate(x), approximate="tanh") * mlp.up(x)))


def test_add_rows_is_index_add_keeping_only_the_index() -> None:
    torch.manual_seed(0)
    target = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    source = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 2, 2, 4])
    grad = torch.randn(5, 3, dtype=torch.float64)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ours = add_rows(target, index, source)
    torch.testing.assert_close(ours, target.index_add(0, index, source))
    ref = torch.autograd.grad(target.index_add(0, index, source), (target, source), grad)
    torch.testing.assert_close(torch.autograd.grad(ours, (target, source), grad), ref)
    assert [t.shape for t in saved] == [index.shape]  # not the (4, 3) source
