"""TrainingSpec: what one optimizer step processes and in which precision."""

from pydantic import Field

from planner.schemas._base import FrozenModel
from planner.schemas.enums import AttentionKernel, DType, Optimizer


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

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by one optimizer step."""
        return self.global_batch_size * self.seq_len
