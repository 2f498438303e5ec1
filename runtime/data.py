"""Training data: synthetic tokens (deterministic in seed and step) or windows of a token file.

Both produce the global batch of a step the same way on every rank, so a parallel run and the
single-process reference see the same tokens; each data-parallel rank then takes its rows.
"""

from pathlib import Path

import numpy as np
import torch

from planner.schemas.errors import SchemaError


def synthetic_batch(
    vocab_size: int, batch: int, seq_len: int, *, step: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (batch, seq_len): random tokens, targets shifted by one. Both
    contiguous: a pipeline's first stage checks its microbatches' strides against the shapes it
    inferred (torch 2.11 does), and a (seq_len + 1)-strided slice fails that check."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, vocab_size, (batch, seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class TokenFile:
    """A flat file of token ids (numpy uint16 or int32), read as consecutive windows."""

    def __init__(self, path: Path, *, vocab_size: int, dtype: str = "uint16") -> None:
        self.path = path
        self.vocab_size = vocab_size
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")

    def batch(self, batch: int, seq_len: int, *, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows step*batch .. step*batch + batch - 1, wrapping around the file.

        Raises:
            SchemaError: the file holds less than one window, or a token id outside the model's
                vocabulary (a file tokenized for another model); every rank reads the same
                windows, so every rank raises the same error.
        """
        span = seq_len + 1
        count = (len(self.tokens) - 1) // span
        if count == 0:
            raise SchemaError(
                f"--data {str(self.path)!r} holds {len(self.tokens)} tokens, too few for one sequence: it needs "
                f"more than {span} (--seq-len + 1); give a longer token file"
            )
        rows = [(step * batch + i) % count for i in range(batch)]
        data = torch.from_numpy(np.stack([self.tokens[r * span : (r + 1) * span].astype(np.int64) for r in rows]))
        if (top := int(data.max())) >= self.vocab_size:
            raise SchemaError(
                f"--data {str(self.path)!r} holds token id {top}, outside the model's vocabulary of "
                f"{self.vocab_size}; tokenize the data with the model's tokenizer"
            )
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()
