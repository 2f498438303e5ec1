"""Upper bounds on the sizes an input may give.

Far above any model, batch or cluster built so far, and low enough that the planner's loops over
layers, batch divisors and ranks end in seconds and its products of sizes stay finite floats. A
value above one is refused where the input is read (the schemas' validators) with one line that
names it, rather than hanging a search or overflowing deep inside it.
"""

from collections.abc import Mapping

from planner.schemas.errors import SchemaError

MAX_COUNT = 2**53
"""Any whole number in a file: counts and sizes the cost model turns into floats stay exact."""
MAX_LAYERS = 100_000
"""Transformer layers (GPT-3 has 96, Llama 3 405B 126); a search loops over them."""
MAX_EXPERTS = 2**20
"""Experts per MoE layer (DeepSeek-V3 has 256)."""
MAX_WIDTH = 2**20
"""A model's widths: hidden_size, the MLP, expert and shared-expert widths, head dims and MLA ranks
(PaLM 540B's MLP, 73,728, is the widest published; this is 14 times that). Bounded so that a
layer's parameters (about 12 h^2, 1.3e13 at this bound) and its activations stay finite, printable
figures: an unbounded 2^40 width printed a peak of 2e18 GiB instead of a refusal."""
MAX_HEADS = 2**16
"""Attention and key/value heads per layer (published models use at most 128); also bounds the
groups of a DeepSeek router, which are counted like heads."""
MAX_VOCAB = 2**24
"""Vocabulary entries (the largest published vocabularies hold some 256,000, Gemma's); the
embedding and output layers are vocab_size x hidden_size and the loss's logits vocab_size per token."""
MAX_GLOBAL_BATCH = 2**30
"""Sequences per optimizer step (published runs use at most a few thousand); a search loops over its divisors."""
MAX_SEQ_LEN = 2**30
"""Tokens per sequence."""
MAX_DEVICES = 2**20
"""Ranks of a cluster (the largest built hold some 10^5 GPUs); a search loops over its degrees."""


def check_at_most(what: str, values: Mapping[str, int | None], limit: int, meaning: str) -> None:
    """Raise SchemaError for the first of ``values`` above ``limit``, naming ``what`` it belongs to."""
    for name, value in values.items():
        if value is not None and value > limit:
            raise SchemaError(
                f"{what}{name}={value} is larger than {meaning} this planner plans (at most {limit:,}); fix the value"
            )


def check_counts(what: str, values: Mapping[str, object]) -> None:
    """Raise SchemaError for the first whole number in ``values`` (a model's fields) above MAX_COUNT."""
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COUNT:
            raise SchemaError(f"{what}{name}={value} is too large a number (at most 2^53); fix the value")
