"""Which attention kernels a profile times, in which precisions, the SDPA backends each plan's kernel
runs with, and the kernel libraries' workspace measured beside them."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from planner.schemas import AttentionKernel, DType
from profiler.ops import _runs, attention_dtypes, attention_kernels, attention_lengths
from profiler.workspace import library_workspace_bytes
from runtime.model import attention_backend, attention_priority


@pytest.mark.parametrize(
    ("kernel", "backend"),
    [
        (AttentionKernel.FLASH, SDPBackend.FLASH_ATTENTION),
        (AttentionKernel.CUDNN, SDPBackend.CUDNN_ATTENTION),
        (AttentionKernel.EAGER, SDPBackend.MATH),
    ],
)
def test_on_cuda_each_kernel_runs_the_backend_it_was_priced_for(kernel: AttentionKernel, backend: SDPBackend) -> None:
    assert attention_backend(kernel, torch.device("cuda", 0)) is backend
    # a CPU runs neither GPU kernel: SDPA chooses, as it always did there
    assert attention_backend(kernel, torch.device("cpu")) is None


def test_a_run_tries_its_kernel_first_and_falls_back_for_what_it_lacks() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    flash, cudnn, efficient, math = (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    )
    assert attention_priority(AttentionKernel.FLASH, cuda) == [flash, cudnn, efficient, math]
    assert attention_priority(AttentionKernel.CUDNN, cuda) == [cudnn, flash, efficient, math]
    assert attention_priority(AttentionKernel.EAGER, cuda) == [math]
    assert all(attention_priority(kernel, cpu) is None for kernel in AttentionKernel)


def test_a_gpu_profile_times_both_fused_kernels_and_a_cpu_one_its_sdpa() -> None:
    assert attention_kernels(torch.device("cuda", 0)) == (AttentionKernel.FLASH, AttentionKernel.CUDNN)
    assert attention_kernels(torch.device("cpu")) == (AttentionKernel.FLASH,)


def test_a_kernel_sdpa_cannot_run_here_is_left_out_not_raised() -> None:
    q = k = v = torch.randn(1, 2, 16, 8)

    def attention() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert _runs(attention)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # no cuDNN on a CPU: SDPA has no kernel
        assert not _runs(attention)


def test_a_profile_times_attention_at_the_lengths_plans_and_their_blocks_run() -> None:
    # its own length and every power of two from 256 to 2k on a CPU, 16k on a GPU (or its own)
    assert attention_lengths(512, torch.device("cpu")) == (256, 512, 1024, 2048)
    assert attention_lengths(3000, torch.device("cpu")) == (256, 512, 1024, 2048, 3000)
    assert attention_lengths(128, torch.device("cpu")) == (128, 256, 512, 1024, 2048)
    assert attention_lengths(4096, torch.device("cuda", 0)) == (256, 512, 1024, 2048, 4096, 8192, 16384)


def test_a_gpu_profile_times_attention_in_every_precision_and_a_cpu_in_its_first() -> None:
    both = (DType.FP32, DType.BF16)
    assert attention_dtypes(both, torch.device("cuda", 0)) == both  # the fused kernels refuse fp32 (`_runs`)
    assert attention_dtypes(both, torch.device("cpu")) == (DType.FP32,)
    assert attention_dtypes((DType.BF16,), torch.device("cpu")) == (DType.BF16,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FlashAttention and cuDNN)")
def test_on_a_gpu_flash_runs_bf16_and_refuses_fp32() -> None:
    for dtype, runs in ((torch.bfloat16, True), (torch.float32, False)):
        q = torch.randn(1, 8, 256, 128, device="cuda", dtype=dtype)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            assert _runs(partial(F.scaled_dot_product_attention, q, q, q, is_causal=True)) is runs


def test_the_library_workspace_is_not_measured_off_a_gpu() -> None:
    called = []
    assert library_workspace_bytes(torch.device("cpu"), lambda: called.append(1)) is None
    assert called == []  # nothing to set up: the probe does not run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (driver memory)")
def test_on_a_gpu_the_workspace_is_the_drivers_growth_not_the_tensors() -> None:
    device = torch.device("cuda", 0)

    def allocate_and_free() -> None:  # 256 MiB of tensor, freed: the allocator returns it
        torch.empty(2**28, dtype=torch.uint8, device=device)

    assert library_workspace_bytes(device, allocate_and_free) < 2**28
