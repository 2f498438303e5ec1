"""Experts split over the tensor-parallel group (expert-tensor parallelism equal to tp,
``runtime.tensor_parallel``): the parts of a split expert sum to the whole expert. The layouts
that train so on 4 ranks are checked in test_moe_layouts_parity (one launch for every MoE layout)."""

import pytest
import torch
from moe_training import MOE

from planner.schemas import Activation
from runtime.mlp import MLP
from runtime.tensor_parallel import split_expert


@pytest.mark.parametrize("act", [Activation.SILU, Activation.GELU])
def test_the_parts_of_a_split_expert_sum_to_the_whole_expert(act: Activation) -> None:
    # gated (gate, up, down) and ungated (up, down) experts with biases, split over 4 ranks: the
    # parts' outputs sum to the whole expert's (down's bias counted once, by rank 0)
    model = MOE.model_copy(update={"hidden_act": act, "mlp_bias": True})
    torch.manual_seed(0)
    whole = MLP(model).double()  # float64: only the order of the sums differs
    with torch.no_grad():
        for p in whole.parameters():
            p.normal_()
    x = torch.randn(5, model.hidden_size, dtype=torch.float64)
    parts = []
    for rank in range(4):
        part = MLP(model).double()
        part.load_state_dict(whole.state_dict())
        split_expert(part, rank, 4)
        assert part.up.weight.shape == (model.intermediate_size // 4, model.hidden_size)
        assert part.down.weight.shape == (model.hidden_size, model.intermediate_size // 4)
        assert (part.down.bias is not None) == (rank == 0)
        parts.append(part(x))
    torch.testing.assert_close(sum(parts), whole(x), atol=1e-9, rtol=1e-12)
