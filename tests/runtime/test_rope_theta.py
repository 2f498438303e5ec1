"""The runtime's rotary angles use the model's rope_theta (Llama 3: 500000), not a fixed 10000."""

import torch

from planner.schemas import ModelSpec
from runtime.model import Attention, rotary

SHAPE = {"name": "m", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32}


def test_rotary_angles_follow_theta() -> None:
    # d = 4: channel pairs (0, 1) and (2, 3) turn by position x theta^0 and position x theta^(-1/2);
    # at position 1 and theta = 10000 the second pair turns by 0.01 rad: (1, 0) -> (cos 0.01, sin 0.01).
    x = torch.tensor([[[[0.0, 0.0, 1.0, 0.0]]]])
    turned = rotary(x, torch.tensor([1]), theta=10000.0)[0, 0, 0]
    expected = torch.tensor([0.0, 0.0, torch.tensor(0.01).cos().item(), torch.tensor(0.01).sin().item()])
    assert torch.allclose(turned, expected, atol=1e-6)
    slower = rotary(x, torch.tensor([1]), theta=1e6)[0, 0, 0]  # 1e6^(-1/2) = 0.001 rad
    assert torch.allclose(slower[3], torch.tensor(0.001).sin(), atol=1e-6)


def test_attention_reads_the_models_theta() -> None:
    torch.manual_seed(0)
    default = Attention(ModelSpec.model_validate(SHAPE))
    llama = Attention(ModelSpec.model_validate({**SHAPE, "rope_theta": 500000.0}))
    llama.load_state_dict(default.state_dict())
    x = torch.randn(1, 8, 16)
    assert (default.rope_theta, llama.rope_theta) == (10000.0, 500000.0)
    assert not torch.allclose(default(x), llama(x))
