"""Which attention kernels a profile times, and the SDPA backends each plan's kernel runs with."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from planner.schemas import AttentionKernel
from profiler.ops import _runs, attention_kernels, attention_lengths
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
