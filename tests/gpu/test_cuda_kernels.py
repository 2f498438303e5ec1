"""The runtime's CUDA-only branches that no CPU run reaches, checked on one CUDA device (marked
gpu; here they skip): the attention kernel a plan names runs the model's grouped-query shapes and
lays its output out as the dry run assumes; an fp32 plan's fused kernel falls back to one that
runs; ring attention's matmul blocks (its path off the CPU) give SDPA's values and gradients; a
checkpoint restores the CUDA generator; FSDP2 as ZeRO-3 runs (bf16 compute, fp32 shards and
gradients) on a one-rank mesh."""

import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from planner.files.models import load_model
from planner.schemas import AttentionKernel, ZeroStage
from planner.schemas.geometry import MeshAxis
from runtime.checkpoint import _rng_state, _set_rng
from runtime.data_parallel import shard_units
from runtime.mesh import group_mesh
from runtime.model import Decoder, attention_priority, default_dtype
from runtime.ring_attention import block_attention, block_attention_backward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh runs these)"
    ),
]

CUDA = torch.device("cuda", 0)
DENSE = "benchmarks/data/gpu_check_dense.yaml"
"""16 query and 4 key/value heads of 128: the one-GPU check's dense model."""


def _qkv(seq: int, dtype: torch.dtype, heads: int = 16, kv_heads: int = 4, d: int = 128) -> list[torch.Tensor]:
    generator = torch.Generator(CUDA).manual_seed(0)
    shapes = ((2, heads, seq, d), (2, kv_heads, seq, d), (2, kv_heads, seq, d))
    return [torch.randn(s, device=CUDA, dtype=dtype, generator=generator, requires_grad=True) for s in shapes]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION])
def test_a_fused_kernel_runs_grouped_query_attention_in_bf16_laid_out_as_the_dry_run_assumes(
    backend: SDPBackend,
) -> None:
    q, k, v = _qkv(2048, torch.bfloat16)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.float().sum().backward()
    assert torch.allclose(out.float(), _reference(q, k, v), atol=2e-2, rtol=2e-2)
    # runtime.dry_run._CudaAttentionLayout: the CUDA kernels return (b, s, heads, d) in memory
    assert out.transpose(1, 2).is_contiguous()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_an_fp32_plan_with_a_fused_kernel_falls_back_to_one_that_runs() -> None:
    q, k, v = _qkv(1024, torch.float32)
    with sdpa_kernel(attention_priority(AttentionKernel.FLASH, CUDA), set_priority=True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(out, _reference(q, k, v), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_attention_blocks_off_the_cpu_give_sdpa_values_and_gradients(dtype: torch.dtype) -> None:
    q, k, v = (t.detach().float().requires_grad_() for t in _qkv(512, dtype, kv_heads=16))
    out, lse = block_attention(q, k, v, causal=True, flash=False)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, expected, atol=1e-4, rtol=1e-4)
    grad_out = torch.randn_like(out)
    dq, dk, dv = block_attention_backward(grad_out, q, k, v, out, lse, causal=True, flash=False)
    expected.backward(grad_out)
    for mine, theirs in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert theirs is not None and torch.allclose(mine, theirs, atol=1e-3, rtol=1e-3)


def test_a_checkpoint_restores_the_cuda_generator() -> None:
    state = _rng_state()
    assert "cuda" in state
    first = torch.randn(8, device=CUDA)
    _set_rng(state)
    assert torch.equal(torch.randn(8, device=CUDA), first)


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A one-rank NCCL group in this process (FSDP2 needs a process group even for one rank)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(CUDA)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=CUDA)
    yield
    dist.destroy_process_group()


def test_fsdp2_as_zero3_computes_in_bf16_and_keeps_fp32_shards_and_gradients(one_rank_group: None) -> None:
    model = load_model(DENSE)
    with default_dtype(torch.float32):
        unit = Decoder(model, seed=0, layers=range(1), embedding=False, output=False).to(CUDA)
    mesh = group_mesh("cuda", 1, 1, MeshAxis.DP)
    shard_units(
        list(unit.layers.values()),
        unit,
        mesh,
        zero_stage=ZeroStage.PARAMETERS,
        dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
    )
    x = torch.randn(1, 256, model.hidden_size, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    out = unit(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    for p in unit.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
        assert torch.isfinite(p.grad.full_tensor()).all()
