"""Buffers the runtime holds and the cost model counts, sized once for both.

Data-parallel gradient buckets: ``GRAD_BUCKETS`` buckets (one reducing while the next fills) of
``GRAD_BUCKET_ELEMENTS`` elements, in the precision gradients are summed in
(``TrainingSpec.reduce_dtype``: fp32 under bf16), capped by the gradients a rank reduces and held
for the whole run, as PyTorch DDP's reducer holds them (its default ``bucket_cap_mb=25``, read as
elements).
``runtime.optim.DataParallelOptimizer`` allocates them; ``cost_models.communication_buffers`` counts them.
"""

from typing import Final

GRAD_BUCKET_ELEMENTS: Final = 25_000_000
"""Elements of one gradient bucket."""
GRAD_BUCKETS: Final = 2
"""Buckets a data-parallel rank keeps."""


def grad_bucket_elements(reduced_elements: float) -> float:
    """Elements of a rank's buckets when it reduces ``reduced_elements`` gradient elements: all of
    its buckets, or fewer elements where its gradients would not fill them."""
    return min(GRAD_BUCKETS * GRAD_BUCKET_ELEMENTS, reduced_elements)
