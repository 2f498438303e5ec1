"""The memory-efficient layer kernels real trainers run, as autograd functions that keep for the
backward what the fused kernels keep, on every device.

- ``RMSNorm``: keeps its input and the fp32 reciprocal root mean square of each row, as
  torch's fused CUDA kernel (``aten._fused_rms_norm``), Apex's ``FusedRMSNorm`` and Transformer
  Engine's RMSNorm do. torch's composite ``rms_norm`` (what a CPU, and a dry run on fake CPU
  tensors, run) keeps the input's fp32 copy and the fp32 normalized input beside its output:
  10 bytes per bf16 element instead of 2.
- ``swiglu``: SiLU(gate) x up keeping its two inputs and recomputing SiLU in the backward, as
  Megatron-Core's ``SwiGLUFunction``; autograd over ``F.silu(gate) * up`` also keeps SiLU(gate),
  one more tensor of the MLP's width.
- ``geglu``: GELU(gate) x up (tanh approximation: Gemma's gated MLP), kept and recomputed the
  same way, as Megatron-Core's ``GeGLUFunction``.

Both compute what the composites compute: the forward is the same arithmetic; the backward
is the textbook derivative (RMSNorm in fp32, as the forward; SwiGLU in the inputs' precision,
as Megatron-Core's ``swiglu_back``). They take DTensors as they take tensors (sequence-parallel
norms).
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * weight over the last dimension, rms in at least fp32; keeps x and 1 / rms."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        wide = x.to(_wide(x.dtype))
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (wide * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        wide = rstd.dtype
        normed = x.to(wide) * rstd
        grad_weight = (grad.to(wide) * normed).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype)
        grad_normed = grad.to(wide) * weight.to(wide)
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The precision the norm computes in: fp32, or the input's if wider (torch's opmath type)."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension with a learned scale (Zhang and Sennrich
    2019), ``nn.RMSNorm``'s parameter and arithmetic, keeping only its input and 1 / rms."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormFunction.apply(x, self.weight, self.eps)  # type: ignore[no-untyped-call]
        return out


class _SwiGLUFunction(torch.autograd.Function):
    """SiLU(gate) x up; keeps gate and up."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        sigmoid = torch.sigmoid(gate)
        grad_up = grad * gate * sigmoid
        grad_gate = grad * up * sigmoid * (1 + gate * (1 - sigmoid))
        return grad_gate, grad_up


_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_CUBIC = 0.044715


class _GeGLUFunction(torch.autograd.Function):
    """GELU(gate) x up, GELU by its tanh approximation; keeps gate and up."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.gelu(gate, approximate="tanh") * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        # GELU(x) = x (1 + tanh u) / 2, u = sqrt(2 / pi) (x + 0.044715 x^3).
        tanh = torch.tanh(_SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate**3))
        gelu = 0.5 * gate * (1 + tanh)
        slope = 0.5 * (1 + tanh) + 0.5 * gate * (1 - tanh * tanh) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * gate**2)
        return grad * up * slope, grad * gelu


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU(gate) x up (Shazeer 2020; tanh GELU, as Gemma), keeping only ``gate`` and ``up`` for the backward."""
    out: torch.Tensor = _GeGLUFunction.apply(gate, up)  # type: ignore[no-untyped-call]
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up (Shazeer 2020), keeping only ``gate`` and ``up`` for the backward."""
    out: torch.Tensor = _SwiGLUFunction.apply(gate, up)  # type: ignore[no-untyped-call]
    return out
