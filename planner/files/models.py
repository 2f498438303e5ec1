"""Models: a preset name, a Hugging Face ``config.json`` or our YAML file → ModelSpec.

Presets ship as package data under ``planner/presets/models/<name>.yaml``. Every error a user can
cause is a SchemaError naming the value and the fix.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import get_args, get_origin

from planner.files.hf_config import spec_values
from planner.files.kinds import refuse_other_kind
from planner.files.reading import did_you_mean, list_presets, preset_named, read_mapping_file, read_preset, validate
from planner.schemas import ModelSpec
from planner.schemas.errors import SchemaError

MODEL_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def list_model_presets() -> tuple[str, ...]:
    """Names of the packaged model presets, sorted."""
    return list_presets("models")


def model_from_dict(raw: Mapping[str, object], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` mapping or our YAML.

    Reads the ModelSpec keys under Hugging Face's names and the other families' spellings of them
    (GPT-2, Falcon, Gemma, Llama 4, Qwen, DeepSeek, a multimodal config's ``text_config``), as
    transformers builds those models: ``planner.files.hf_config``. Encoders and encoder-decoders are
    refused. Other keys are logged at DEBUG and ignored, unless one looks like a misspelling of a
    key that is read.

    Args:
        raw: the parsed file.
        name: the model's display name (preset name or file stem), used in messages.

    Returns:
        The validated ModelSpec.

    Raises:
        SchemaError: a misspelled, missing or invalid key, naming it, its value and what is expected.
    """
    if not isinstance(raw, Mapping):
        raise SchemaError(f"model {name!r} must be a mapping of keys to values, not {type(raw).__name__}")
    values = spec_values(raw, name)
    _reject_coercions(values, name)
    return validate(ModelSpec, {"name": name, **values}, f"model {name!r}")


def load_model(spec: str) -> ModelSpec:
    """Load a model: a preset name, or a path to a ``.json``/``.yaml``/``.yml`` file.

    Args:
        spec: a preset name (``llama3-8b``; any case) or a model file's path (a Hugging Face
            config.json names the model after its folder).

    Returns:
        The model.

    Raises:
        SchemaError: unknown preset, missing or malformed file, or an invalid model.
    """
    presets = list_model_presets()
    preset = preset_named(spec, presets)
    if preset is not None:
        return model_from_dict(read_preset("models", preset), name=preset)
    path = Path(spec)
    hint = (
        f"give a model preset ({', '.join(presets)}) or a path to a model file ending in "
        f"{', '.join(MODEL_FILE_SUFFIXES)}"
    )
    if path.suffix.lower() not in MODEL_FILE_SUFFIXES:
        raise SchemaError(f"unknown model {spec!r}{did_you_mean(spec, presets)}: {hint}")
    if not path.is_file():
        raise SchemaError(f"model file {spec!r} does not exist: {hint}")
    # A Hugging Face checkout names its file config.json; its folder names the model.
    stem = path.resolve().parent.name if path.stem == "config" and path.resolve().parent.name else path.stem
    document = read_mapping_file(path)
    refuse_other_kind(document, spec, "model config")
    return model_from_dict(document, name=stem)


def _reject_coercions(values: Mapping[str, object], name: str) -> None:
    """pydantic would read true as 1 and "yes" as true; a model file must say what it means."""
    for key, value in values.items():
        annotation = ModelSpec.model_fields[key].annotation
        if get_origin(annotation) is tuple:  # a list of whole numbers (mlp_only_layers)
            if isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                continue
            raise SchemaError(f"model {name!r}: {key}={value!r} must be a list of whole numbers")
        kinds = set(get_args(annotation)) or {annotation}
        if value is None and type(None) in kinds:
            continue
        if int in kinds and (isinstance(value, bool) or not isinstance(value, int)):
            expected = "a whole number"
        elif bool in kinds and not isinstance(value, bool):
            expected = "true or false"
        elif float in kinds and (isinstance(value, bool) or not isinstance(value, int | float)):
            expected = "a number"
        else:
            continue
        raise SchemaError(f"model {name!r}: {key}={value!r} must be {expected}")
