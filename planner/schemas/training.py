"""TrainingSpec: what one optimizer step processes and in which precision."""

from typing import Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.bounds import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, check_at_most
from planner.schemas.enums import AttentionKernel, DType, Kernels, MoeDispatcher, Optimizer
from planner.schemas.errors import SchemaError


class TrainingSpec(FrozenModel):
    """Global batch, sequence length, precision and optimizer of a training run."""

    global_batch_size: int = Field(ge=1, description="Sequences per optimizer step (B).")
    seq_len: int = Field(ge=1, description="Tokens per sequence (s).")
    dtype: DType = Field(default=DType.BF16, description="bf16/fp16 mean mixed precision with fp32 master weights.")
    optimizer: Optimizer = Field(default=Optimizer.ADAM)
    attention_kernel: AttentionKernel = Field(
        default=AttentionKernel.FLASH,
        description="'flash' never stores the s x s scores; 'eager' does (as Megatron-LM did in 2021).",
    )
    kernels: Kernels = Field(
        default=Kernels.FUSED,
        description=(
            "'fused': the norms, activations, rotary embedding, loss and optimizer step each run as one kernel "
            "(Transformer Engine, Megatron-Core, torch.compile); 'eager': one kernel per tensor operation, each "
            "through memory (eager PyTorch, as the planner's own runtime runs them)."
        ),
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description=(
            "Tensor parallelism with sequence parallelism: each all-gather and reduce-scatter runs in chunks behind "
            "the GEMM it feeds or follows (Megatron-Core's --tp-comm-overlap with Transformer Engine's userbuffers, "
            "torch's async tensor parallelism). Priced on GPUs; the planner's own runtime runs them synchronously."
        ),
    )
    pp_comm_overlap: bool = Field(
        default=True,
        description=(
            "Interleaved pipelines: each steady-state send and receive runs behind the next chunk's compute, as "
            "Megatron-LM runs them by default (--overlap-p2p-communication; Megatron Bridge turns it on with virtual "
            "stages); the transfers that fill and drain the pipeline stay exposed. Priced on GPUs."
        ),
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Mixture of experts: each expert takes at most this many times its even share of a rank's routed "
            "tokens and drops the rest (GShard, Switch; Megatron-LM's --moe-expert-capacity-factor). "
            "None: dropless, every routed token is computed."
        ),
    )
    moe_pad_to_capacity: bool = Field(
        default=False,
        description="With a capacity factor, every expert computes and exchanges its full capacity, padded.",
    )
    moe_dispatcher: MoeDispatcher = Field(
        default=MoeDispatcher.ALLTOALL,
        description=(
            "Mixture of experts: 'alltoall' sends every (token, expert) pair; 'deepep' sends a token once to each "
            "remote node it is routed to and forwards it there over NVLink (DeepEP, Megatron-Core's flex dispatcher). "
            "The planner's own runtime runs 'alltoall'."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        check_at_most("", {"global_batch_size": self.global_batch_size}, MAX_GLOBAL_BATCH, "any batch")
        check_at_most("", {"seq_len": self.seq_len}, MAX_SEQ_LEN, "any sequence")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise SchemaError(
                "moe_pad_to_capacity needs a moe_capacity_factor (e.g. 1.25); give one or drop the padding"
            )
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by one optimizer step."""
        return self.global_batch_size * self.seq_len
