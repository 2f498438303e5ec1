"""The longest sequence a model allows (ModelSpec.max_seq_len), worked by hand for each position
type and rope type, and check_seq_len's one-line refusal."""

import pytest

from planner.schemas import ModelSpec, PositionEmbedding, RopeScaling, RopeType
from planner.schemas.errors import SchemaError
from planner.schemas.model import check_seq_len

SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}


def model(**extra: object) -> ModelSpec:
    return ModelSpec.model_validate({"name": "m", **SHAPE, **extra})


@pytest.mark.parametrize(
    ("max_positions", "scaling", "limit"),
    [
        # linear (position interpolation, vicuna-7b-v1.5-16k): 4096 trained positions x 4 = 16384.
        (4096, {"rope_type": "linear", "factor": 4.0}, 16384),
        # dynamic NTK: the base grows past 4096; the stretched context is 4096 x 2 = 8192.
        (4096, {"rope_type": "dynamic", "factor": 2.0}, 8192),
        # yarn with its original length (DeepSeek-V3): 4096 x 40 = 163840, its max_position_embeddings.
        (163840, {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}, 163840),
        # yarn added to Qwen3 as its model card says: 32768 x 4 = 131072, max_position_embeddings left 40960.
        (40960, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
        # yarn without an original length: max_position_embeddings is the pre-yarn length, 32768 x 4.
        (32768, {"rope_type": "yarn", "factor": 4.0}, 131072),
        # llama3 (Llama 3.1): 131072 is already scaled (8192 x 8 would be only 65536).
        (131072, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 131072),
        # longrope (Phi-3-mini-128k): max_position_embeddings 131072 beside an original 4096.
        (131072, {"rope_type": "longrope", "original_max_position_embeddings": 4096}, 131072),
        # Gemma 3: linear x 8 on a max_position_embeddings that already is the scaled 131072.
        (131072, {"rope_type": "linear", "factor": 8.0, "scaled_max_position_embeddings": True}, 131072),
        # a type the planner does not know: max_position_embeddings, whatever its factor.
        (32768, {"rope_type": "mrope", "factor": 4.0}, 32768),
        (2048, {"rope_type": "default"}, 2048),
    ],
)
def test_each_rope_type_reaches_its_hand_worked_length(
    max_positions: int, scaling: dict[str, object], limit: int
) -> None:
    spec = model(max_position_embeddings=max_positions, rope_scaling=scaling)
    assert spec.max_seq_len == limit
    assert RopeScaling.model_validate(scaling).max_seq_len(max_positions) == limit


def test_fractional_factors_round_down() -> None:
    # 4096 x 2.5 = 10240 exactly; 1000 x 1.5 = 1500; 999 x 1.5 = 1498.5 -> 1498.
    assert model(max_position_embeddings=4096, rope_scaling={"rope_type": "linear", "factor": 2.5}).max_seq_len == 10240
    assert model(max_position_embeddings=999, rope_scaling={"rope_type": "dynamic", "factor": 1.5}).max_seq_len == 1498


def test_positions_without_scaling() -> None:
    assert model(max_position_embeddings=8192).max_seq_len == 8192  # rotary
    assert model().max_seq_len == 2048  # Hugging Face's default max_position_embeddings
    absolute = model(max_position_embeddings=1024, position_embedding_type="absolute")
    assert absolute.max_seq_len == 1024
    assert model(position_embedding_type="alibi").max_seq_len is None  # nothing to run out of


def test_unknown_types_are_kept_and_named() -> None:
    scaling = RopeScaling(rope_type="mrope")
    assert scaling.known_type is None and scaling.rope_type == "mrope"
    assert "does not know" in scaling.describe(32768)
    assert RopeScaling(rope_type="yarn", factor=2).known_type is RopeType.YARN


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3"])
def test_types_that_stretch_need_a_factor(rope_type: str) -> None:
    with pytest.raises(SchemaError, match="needs a factor"):
        RopeScaling(rope_type=rope_type)


def test_scaling_is_refused_on_positions_that_are_not_rotary() -> None:
    with pytest.raises(SchemaError, match="drop rope_scaling or set position_embedding_type: rope"):
        model(position_embedding_type="absolute", rope_scaling={"rope_type": "linear", "factor": 2.0})


def test_scaling_is_immutable_and_hashable() -> None:
    spec = model(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert spec.rope_scaling is not None
    with pytest.raises(ValueError, match="frozen"):
        spec.rope_scaling.factor = 8.0  # type: ignore[misc]
    assert hash(spec) == hash(model(rope_scaling={"rope_type": "yarn", "factor": 4.0}))


def test_a_sequence_within_the_limit_passes() -> None:
    check_seq_len(model(max_position_embeddings=8192), 8192)
    check_seq_len(model(position_embedding_type="alibi"), 10**6)


def test_absolute_positions_are_a_hard_limit() -> None:
    spec = model(max_position_embeddings=2048, position_embedding_type=PositionEmbedding.ABSOLUTE)
    with pytest.raises(SchemaError) as refused:
        check_seq_len(spec, 4096)
    message = str(refused.value)
    assert "\n" not in message
    assert "seq_len=4096" in message and "2048 tokens" in message and "learned absolute positions" in message
    assert "--seq-len of at most 2048" in message and "rope_scaling" not in message


def test_rotary_without_scaling_names_the_rope_scaling_that_would_reach() -> None:
    with pytest.raises(SchemaError) as refused:
        check_seq_len(model(max_position_embeddings=8192), 20000)
    message = str(refused.value)
    assert "\n" not in message
    assert "seq_len=20000" in message and "8192 tokens" in message and "no rope_scaling" in message
    # 20000 / 8192 = 2.44: factor 3 reaches 24576.
    assert "rope_scaling: {rope_type: yarn, factor: 3, original_max_position_embeddings: 8192}" in message


def test_the_default_max_positions_is_said_to_be_a_default() -> None:
    with pytest.raises(SchemaError, match=r"max_position_embeddings=2048 \(not set"):
        check_seq_len(model(), 4096)


def test_a_scaled_model_beyond_its_reach_is_told_the_original_length() -> None:
    llama31 = model(
        max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
    )
    with pytest.raises(SchemaError) as refused:
        check_seq_len(llama31, 2**20)
    message = str(refused.value)
    assert "131072 tokens" in message and "rope_scaling llama3" in message
    # 2^20 / 8192 = 128 exactly.
    assert "{rope_type: yarn, factor: 128, original_max_position_embeddings: 8192}" in message
    stretched = llama31.model_copy(
        update={"rope_scaling": RopeScaling(rope_type="yarn", factor=128, original_max_position_embeddings=8192)}
    )
    check_seq_len(stretched, 2**20)  # the suggested file reaches 1,048,576 tokens
