"""Hugging Face ``config.json`` files read as the models they describe.

ModelSpec's field names are Hugging Face's (``hidden_size``, ``num_key_value_heads``, ...), so a
Llama-style config reads key for key. Other families spell the same quantities their own way, or
mean something else by the same key; each rule below follows what transformers builds from the
config (``modeling_<type>.py``), named where it is applied:

- GPT-2 and GPT-BigCode: ``n_embd``, ``n_layer``, ``n_head``, ``n_positions``, ``n_inner`` (null
  is 4h), ``activation_function``; learned positions and biases everywhere.
- Falcon: ``multi_query`` (one key/value head), ``num_kv_heads`` under ``new_decoder_architecture``,
  ``ffn_hidden_size``, ``activation``, ``bias``, ``alibi``; the original RefinedWeb spellings
  ``n_embed``, ``n_head_kv``.
- Gemma: a gated MLP (gate, up, down) whatever ``hidden_act``/``hidden_activation`` says, so its
  GELU reads as gated GELU.
- Llama 4's text model: ``intermediate_size`` is the experts' width, ``intermediate_size_mlp`` the
  dense layers', ``interleave_moe_layer_step``/``moe_layers`` choose the MoE layers, and every MoE
  layer has one shared expert.
- A multimodal config's ``text_config`` is the language model; its other towers are left out.
- ``rope_scaling`` (transformers 5: ``rope_parameters``, for Gemma 3 per layer type, of which the
  full-attention layers' reach the whole sequence), ``type`` being its older spelling of
  ``rope_type`` and ``su`` Phi-3's first name for ``longrope``; Phi-3's top-level
  ``original_max_position_embeddings``; Gemma 3's ``max_position_embeddings`` is its scaled length
  (vLLM reads it so too). List-valued parameters are left out (``planner.schemas.rope``).
- Encoders and encoder-decoders are refused: the planner plans decoder-only models.

Keys no rule reads are logged and ignored, unless one looks like a misspelling of a key that is
read; keys known to be real but not read are listed, so that they are never taken for typos.
"""

import difflib
import logging
from collections.abc import Mapping
from types import MappingProxyType

from planner.schemas import Activation, ModelSpec, NormKind, PositionEmbedding, RopeScaling, RopeType
from planner.schemas.errors import SchemaError

logger = logging.getLogger(__name__)

# ModelSpec keys, read under their Hugging Face names.
_SPEC_KEYS = tuple(key for key in ModelSpec.model_fields if key != "name")
# Other Hugging Face spellings of the same quantity; the ModelSpec spelling wins when both are set,
# and a null alias means "the default" (GPT-2's n_inner: null is 4h).
_ALIASES = MappingProxyType(
    {
        "resid_pdrop": "hidden_dropout",
        "hidden_dropout_prob": "hidden_dropout",
        "attn_pdrop": "attention_dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "num_experts": "num_local_experts",  # Qwen-MoE
        "n_routed_experts": "num_local_experts",  # DeepSeek
    }
)
# Spellings of other families (GPT-2, GPT-BigCode, Falcon, Gemma 2/3), read like the aliases but
# not offered as corrections: "n_heads" (MPT) is no misspelling of GPT-2's "n_head".
_FAMILY_ALIASES = MappingProxyType(
    {
        "n_embd": "hidden_size",  # GPT-2
        "n_embed": "hidden_size",  # RefinedWeb (Falcon's first release)
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_positions": "max_position_embeddings",
        "n_inner": "intermediate_size",
        "ffn_hidden_size": "intermediate_size",  # Falcon
        "activation_function": "hidden_act",  # GPT-2
        "activation": "hidden_act",  # Falcon
        "hidden_activation": "hidden_act",  # Gemma 2/3
        "num_experts_per_token": "num_experts_per_tok",  # Kimi-Linear, Bailing
        # AFMoE, EXAONE-MoE, Hunyuan v3, Cohere2-MoE: shared experts of the routed experts' width.
        "num_shared_experts": "n_shared_experts",
    }
)
# Keys whose presence tells the norm; an explicit norm_type wins.
_NORM_HINTS = MappingProxyType(
    {
        "rms_norm_eps": NormKind.RMSNORM,
        "layer_norm_eps": NormKind.LAYERNORM,
        "layer_norm_epsilon": NormKind.LAYERNORM,
    }
)
# Keys whose presence means rotary positions unless position_embedding_type says otherwise
# (rope_parameters is transformers 5's spelling of rope_theta and rope_scaling).
_ROPE_HINTS = ("rope_theta", "rope_parameters")
_ROPE_FIELDS = tuple(RopeScaling.model_fields)
_ROPE_TYPE_ALIASES = MappingProxyType({"su": RopeType.LONGROPE})  # Phi-3's first configs, as transformers reads them
# transformers 5's rope_parameters by layer type: the full-attention layers reach the whole sequence.
_FULL_ATTENTION = "full_attention"
# Model types whose max_position_embeddings already is the length linear scaling reaches (Gemma 3: 128K).
_SCALED_MAX_POSITIONS_MODEL_TYPES = frozenset({"gemma3", "gemma3_text"})
_ORIGINAL_MAX_POSITIONS = "original_max_position_embeddings"
# What a model_type implies that its config.json has no key for (transformers' modeling files):
# Qwen2 puts biases on q, k, v only; Qwen3 and Gemma 3 normalize each q and k head; GPT-2 learns its positions
# and has biases on every projection.
_GPT2_BLOCK: Mapping[str, object] = {
    "position_embedding_type": PositionEmbedding.ABSOLUTE,
    "attention_bias": True,
    "mlp_bias": True,
}
_MODEL_TYPE_DEFAULTS: Mapping[str, Mapping[str, object]] = MappingProxyType(
    {
        "qwen2": {"qkv_bias": True},
        "qwen2_moe": {"qkv_bias": True},
        "qwen3": {"qk_norm": True},
        "qwen3_moe": {"qk_norm": True},
        "gemma3_text": {"qk_norm": True},  # Gemma3Attention's q_norm, k_norm
        "gpt2": _GPT2_BLOCK,
        "gpt_bigcode": _GPT2_BLOCK,
    }
)
# Model types whose MLP is gate, up and down whatever its activation (GemmaMLP, LlamaMLP and the
# MLPs and experts copied from it): GELU there is gated GELU. Gemma's is GELU.
_GATED_MLP_MODEL_TYPES = frozenset(
    {
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "llama",
        "llama4_text",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "deepseek_v2",
        "deepseek_v3",
    }
)
_GELUS = frozenset({Activation.GELU, Activation.GELU_NEW, Activation.GELU_TANH})
_GEMMA_ACT, _LLAMA_ACT = Activation.GELU_TANH, Activation.SILU
# The activation of a config.json that names none: the default its transformers config class
# declares (hidden_act, or Gemma 2/3's hidden_activation, GPT-2's activation_function, Falcon's
# activation), not ModelSpec's GELU, which the gated-MLP rule would turn into GEGLU.
_DEFAULT_ACTIVATIONS: Mapping[str, Activation] = MappingProxyType(
    {
        **dict.fromkeys(("gemma", "gemma2", "gemma3_text"), _GEMMA_ACT),
        **dict.fromkeys(
            ("llama", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"), _LLAMA_ACT
        ),
        **dict.fromkeys(("deepseek_v2", "deepseek_v3", "phi3", "olmo"), _LLAMA_ACT),
        "gpt2": Activation.GELU_NEW,
        "gpt_bigcode": Activation.GELU_TANH,
        "falcon": Activation.GELU,
    }
)
_FALCON_MODEL_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})
# DeepSeek-V3's multi-token-prediction layers: trained beside the model by DeepSeek, absent from
# transformers' model; the planner plans the model without them.
_MTP_KEY = "num_nextn_predict_layers"
# Encoder-only model types (their configs carry no is_encoder_decoder key).
_ENCODER_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "distilbert",
        "albert",
        "electra",
        "deberta",
        "deberta-v2",
        "mpnet",
        "modernbert",
    }
)
# Keys of the families above that the rules read (beyond ModelSpec's and the aliases).
_RULE_KEYS = (
    "model_type",
    "text_config",
    "is_encoder_decoder",
    "multi_query",  # Falcon, GPT-BigCode
    "new_decoder_architecture",  # Falcon
    "num_kv_heads",  # Falcon
    "n_head_kv",  # RefinedWeb
    "bias",  # Falcon
    "alibi",  # Falcon
    "intermediate_size_mlp",  # Llama 4
    "interleave_moe_layer_step",  # Llama 4
    "moe_layers",  # Llama 4
    _ORIGINAL_MAX_POSITIONS,  # Phi-3: the length before its longrope scaling
    _MTP_KEY,
)
# Real keys that change nothing the planner prices, or that it does not model yet, each named by
# the family that writes it; known, so never taken for a misspelling of a key that is read.
_KNOWN_UNREAD_KEYS = (
    "qk_head_dim",  # DeepSeek: qk_nope_head_dim + qk_rope_head_dim
    "n_ctx",  # GPT-2: the same as n_positions
    "parallel_attn",  # Falcon: attention and MLP side by side (same matrices)
    "num_ln_in_parallel_attn",  # Falcon
    "vision_config",  # multimodal: the vision tower, left out
    "attention_chunk_size",  # Llama 4: chunked local attention on 3 of 4 layers (priced as full)
    "no_rope_layers",  # Llama 4
    "use_qk_norm",  # Llama 4: an L2 norm without weights
    "attention_out_bias",  # Seed-OSS: a bias on the output projection only (h elements a layer)
    "query_pre_attn_scalar",  # Gemma 2/3
    "sliding_window",
    "layer_types",
)
_MISSPELLING_TARGETS = tuple(
    sorted({*_SPEC_KEYS, *_ALIASES, *_NORM_HINTS, *_ROPE_HINTS, "model_type", _MTP_KEY, "intermediate_size_mlp"})
)
_KNOWN_KEYS = frozenset({*_MISSPELLING_TARGETS, *_FAMILY_ALIASES, *_RULE_KEYS, *_KNOWN_UNREAD_KEYS})
_MISSPELLING_CUTOFF = 0.85


def spec_values(raw: Mapping[str, object], name: str) -> dict[str, object]:
    """The ModelSpec values (without ``name``) a Hugging Face config or our YAML means.

    Raises:
        SchemaError: an encoder or encoder-decoder, a misspelled key, or contradictory norm keys.
    """
    raw = _decoder_text_model(raw, name)
    _reject_misspellings(raw, name)
    # null means "the default" (transformers writes None for what it leaves unset; Qwen's
    # mlp_only_layers: null is "none"); a required key's null is reported as a bad value.
    values: dict[str, object] = {
        key: raw[key]
        for key in _SPEC_KEYS
        if key in raw and (raw[key] is not None or ModelSpec.model_fields[key].is_required())
    }
    for alias, key in (*_ALIASES.items(), *_FAMILY_ALIASES.items()):
        if raw.get(alias) is not None and key not in values:
            values[key] = raw[alias]
    model_type = raw.get("model_type")
    model_type = model_type if isinstance(model_type, str) else ""
    for key, value in _MODEL_TYPE_DEFAULTS.get(model_type, {}).items():
        values.setdefault(key, value)
    if raw.get(_MTP_KEY):
        logger.info(
            "model %r: %s=%r multi-token-prediction layers left out (transformers' model has none)",
            name,
            _MTP_KEY,
            raw[_MTP_KEY],
        )
    _key_value_heads(raw, model_type, values)
    _rope(raw, model_type, values, name)
    if model_type in _FALCON_MODEL_TYPES:
        _falcon(raw, values)
    if model_type == "llama4_text":
        _llama4_text(raw, values)
    if model_type in _DEFAULT_ACTIVATIONS:
        values.setdefault("hidden_act", _DEFAULT_ACTIVATIONS[model_type])
    if model_type in _GATED_MLP_MODEL_TYPES and _activation(values.get("hidden_act")) in _GELUS:
        values["hidden_act"] = Activation.GEGLU
    if "norm_type" not in values:
        hinted = {_NORM_HINTS[key] for key in _NORM_HINTS if key in raw}
        if len(hinted) > 1:
            raise SchemaError(
                f"model {name!r} sets both an RMSNorm and a LayerNorm epsilon; add norm_type: rmsnorm or layernorm"
            )
        if hinted:
            values["norm_type"] = hinted.pop()
    if "position_embedding_type" not in values and any(key in raw for key in _ROPE_HINTS):
        values["position_embedding_type"] = PositionEmbedding.ROPE
    return values


def _decoder_text_model(raw: Mapping[str, object], name: str) -> Mapping[str, object]:
    """The decoder-only language model a config describes: itself, or a multimodal config's
    ``text_config`` (its vision or audio towers left out). Encoders and encoder-decoders are refused."""
    model_type = raw.get("model_type")
    if raw.get("is_encoder_decoder") is True:
        raise SchemaError(
            f"model {name!r} is an encoder-decoder (is_encoder_decoder: true, model_type {model_type!r}); "
            "the planner plans decoder-only language models: give one's config (Llama, GPT-2, Mixtral, ...)"
        )
    if model_type in _ENCODER_MODEL_TYPES:
        raise SchemaError(
            f"model {name!r} is an encoder (model_type {model_type!r}); the planner plans decoder-only "
            "language models: give one's config (Llama, GPT-2, Mixtral, ...)"
        )
    text = raw.get("text_config")
    if text is None:
        return raw
    if not isinstance(text, Mapping):
        raise SchemaError(f"model {name!r}: text_config must be a mapping of the language model's keys")
    _reject_misspellings(raw, name)
    towers = sorted(key.removesuffix("_config") for key in raw if key.endswith("_config") and key != "text_config")
    logger.warning(
        "model %r (model_type %r): planning its text model (text_config, model_type %r)%s",
        name,
        model_type,
        text.get("model_type"),
        f"; the {', '.join(towers)} tower{'s' if len(towers) > 1 else ''} left out" if towers else "",
    )
    # A key the outer config sets for the whole model (tie_word_embeddings) holds unless the text model says.
    outer = {key: raw[key] for key in _SPEC_KEYS if key in raw}
    return _decoder_text_model({**outer, **text}, name)


def _reject_misspellings(raw: Mapping[str, object], name: str) -> None:
    """Ignore keys the planner does not read, but refuse those that look like a misspelled one."""
    for key in raw:
        if not isinstance(key, str):
            raise SchemaError(f"model {name!r} has a non-text key {key!r}")
        if key in _KNOWN_KEYS:
            continue
        close = difflib.get_close_matches(key, _MISSPELLING_TARGETS, n=1, cutoff=_MISSPELLING_CUTOFF)
        if close:
            raise SchemaError(f"unknown key {key!r} in {name}; did you mean {close[0]!r}?")
        logger.debug("model %r: key %r is not used by the planner; ignored", name, key)


def _key_value_heads(raw: Mapping[str, object], model_type: str, values: dict[str, object]) -> None:
    """Key/value heads from Falcon's and GPT-BigCode's keys, where num_key_value_heads is absent.

    Falcon (FalconAttention): ``num_kv_heads`` under ``new_decoder_architecture``, else one head
    when ``multi_query`` (its default: true), else one per query head; GPT-BigCode: one head when
    ``multi_query``.
    """
    if "num_key_value_heads" in values:
        return
    kv_heads = raw.get("num_kv_heads", raw.get("n_head_kv"))
    if model_type in _FALCON_MODEL_TYPES or "new_decoder_architecture" in raw:
        if raw.get("new_decoder_architecture") is True:
            if kv_heads is not None:
                values["num_key_value_heads"] = kv_heads
        elif raw.get("multi_query", model_type in _FALCON_MODEL_TYPES) is True:
            values["num_key_value_heads"] = 1
    elif raw.get("multi_query") is True:
        values["num_key_value_heads"] = 1
    elif kv_heads is not None:
        values["num_key_value_heads"] = kv_heads


def _falcon(raw: Mapping[str, object], values: dict[str, object]) -> None:
    """Falcon's ``bias`` puts biases on every projection; ``alibi`` replaces rotary positions."""
    if "bias" in raw:
        values.setdefault("attention_bias", raw["bias"])
        values.setdefault("mlp_bias", raw["bias"])
    if raw.get("alibi") is True:
        values.setdefault("position_embedding_type", PositionEmbedding.ALIBI)


def _llama4_text(raw: Mapping[str, object], values: dict[str, object]) -> None:
    """Llama 4's text model (Llama4TextDecoderLayer, Llama4TextMoe): ``intermediate_size`` is each
    expert's width and of the one shared expert every MoE layer has; ``intermediate_size_mlp`` the
    dense layers' width; MoE layers are ``moe_layers``, else every ``interleave_moe_layer_step``-th
    (layers step-1, 2 step-1, ...: Qwen-MoE's decoder_sparse_step rule)."""
    if "intermediate_size" in raw:
        values.setdefault("moe_intermediate_size", raw["intermediate_size"])
        values.pop("intermediate_size", None)
    if raw.get("intermediate_size_mlp") is not None:
        values["intermediate_size"] = raw["intermediate_size_mlp"]
    values.setdefault("n_shared_experts", 1)
    moe_layers, layers = raw.get("moe_layers"), raw.get("num_hidden_layers")
    if isinstance(moe_layers, list) and isinstance(layers, int):
        values.setdefault("mlp_only_layers", [i for i in range(layers) if i not in moe_layers])
    elif raw.get("interleave_moe_layer_step") is not None:
        values.setdefault("decoder_sparse_step", raw["interleave_moe_layer_step"])


def _rope(raw: Mapping[str, object], model_type: str, values: dict[str, object], name: str) -> None:
    """``rope_theta`` and ``rope_scaling`` from ``rope_scaling`` or transformers 5's ``rope_parameters``.

    ``rope_type: default`` means no scaling; a type the planner does not know is kept, with a warning.
    """
    where = f"model {name!r}"
    scaling = raw.get("rope_scaling")
    parameters = raw.get("rope_parameters")
    if parameters is not None:
        if isinstance(parameters, Mapping) and _FULL_ATTENTION in parameters:
            parameters = parameters[_FULL_ATTENTION]
        if not isinstance(parameters, Mapping):
            raise SchemaError(f"{where}: rope_parameters must be a mapping (rope_type, rope_theta, factor, ...)")
        if parameters.get("rope_theta") is not None:
            values.setdefault("rope_theta", parameters["rope_theta"])
        scaling = parameters if scaling is None else scaling
    values.pop("rope_scaling", None)
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise SchemaError(f"{where}: rope_scaling={scaling!r} must be a mapping, e.g. {{rope_type: yarn, factor: 4.0}}")
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if not isinstance(rope_type, str):
        raise SchemaError(
            f"{where}: rope_scaling needs a rope_type ({', '.join(RopeType)}), e.g. {{rope_type: yarn, factor: 4.0}}"
        )
    rope_type = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type == RopeType.DEFAULT:
        return
    kept: dict[str, object] = {key: scaling[key] for key in _ROPE_FIELDS if scaling.get(key) is not None}
    kept["rope_type"] = rope_type
    if _ORIGINAL_MAX_POSITIONS not in kept and raw.get(_ORIGINAL_MAX_POSITIONS) is not None:
        kept[_ORIGINAL_MAX_POSITIONS] = raw[_ORIGINAL_MAX_POSITIONS]
    if model_type in _SCALED_MAX_POSITIONS_MODEL_TYPES and rope_type in (RopeType.LINEAR, RopeType.DYNAMIC):
        kept.setdefault("scaled_max_position_embeddings", True)
    for key, value in kept.items():
        flag = key == "scaled_max_position_embeddings"
        if key != "rope_type" and (isinstance(value, bool) != flag or not isinstance(value, int | float)):
            expected = "true or false" if flag else "a number"
            raise SchemaError(f"{where}: rope_scaling.{key}={value!r} must be {expected}")
    left_out = sorted(set(scaling) - {*_ROPE_FIELDS, "type", "rope_theta"})
    if left_out:
        logger.debug("%s: rope_scaling keys %s change no length; not kept", where, ", ".join(map(str, left_out)))
    if rope_type not in tuple(RopeType):
        logger.warning(
            "%s: rope_scaling type %r is not one the planner knows (%s); its longest sequence is taken as "
            "max_position_embeddings",
            where,
            rope_type,
            ", ".join(RopeType),
        )
    values["rope_scaling"] = kept


def _activation(value: object) -> Activation | None:
    """``value`` as an Activation, or None if it names none (validation reports it)."""
    try:
        return Activation(str(value))
    except ValueError:
        return None
