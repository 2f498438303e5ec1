"""Clusters: a preset ``NAME:NODES``, presets mixed with ``+``, or a profile JSON → ClusterProfile;
and a profile written back as the profiler writes it."""

from pathlib import Path

from pydantic import ValidationError

from planner.files.cluster_mix import MIX_SEPARATOR, mix_clusters
from planner.files.cluster_presets import cluster_preset, list_cluster_presets
from planner.files.kinds import refuse_other_kind
from planner.files.reading import describe, did_you_mean, load_json, preset_named, read_text
from planner.schemas import ClusterProfile
from planner.schemas.cluster import CLUSTER_SCHEMA_VERSION, READABLE_VERSIONS, upgrade
from planner.schemas.errors import SchemaError


def load_cluster(spec: str) -> ClusterProfile:
    """Load a cluster: a preset ``NAME:NODES`` (e.g. ``dgx-a100-80g:16``), a mixed cluster of presets
    joined by ``+`` (``dgx-a100-80g:4+dgx-h100:4``: ``planner.files.cluster_mix``), or a path to a profile JSON.

    Args:
        spec: the preset, mixed cluster or profile path.

    Returns:
        The cluster profile.

    Raises:
        SchemaError: a malformed spec, unknown preset, missing or malformed file, or an invalid profile.
    """
    presets = list_cluster_presets()
    example = f"{presets[0]}:16" if presets else "NAME:16"
    form = (
        f"expected NAME:NODES with NAME one of {', '.join(presets)} (e.g. {example}), parts of a mixed cluster "
        f"joined by {MIX_SEPARATOR} (e.g. dgx-a100-80g:4{MIX_SEPARATOR}dgx-h100:4), or a path to a profile .json"
    )
    path = Path(spec)
    if path.suffix.lower() == ".json" or path.is_file():
        if not path.is_file():
            raise SchemaError(f"cluster profile file {spec!r} does not exist; {form}")
        return _load_cluster_file(path)
    if MIX_SEPARATOR in spec:
        return mix_clusters([_preset_part(part, spec, presets, form) for part in spec.split(MIX_SEPARATOR)], spec=spec)
    return _preset_part(spec, spec, presets, form)


def _preset_part(part: str, spec: str, presets: tuple[str, ...], form: str) -> ClusterProfile:
    """One ``NAME:NODES`` of a cluster spec (the whole spec, or one part of a mixed one)."""
    given, colon, nodes = part.partition(":")
    name = preset_named(given, presets)
    if not colon:
        if name is not None:
            raise SchemaError(f"cluster {spec!r} needs a node count: write {name}:NODES, e.g. {name}:16")
        raise SchemaError(
            f"cluster {spec!r} is neither a preset nor an existing file{did_you_mean(given, presets)}; {form}"
        )
    if name is None:
        raise SchemaError(f"unknown cluster preset {given!r} in {spec!r}{did_you_mean(given, presets)}; {form}")
    if not (nodes.isascii() and nodes.isdigit()) or int(nodes) < 1:
        raise SchemaError(f"cluster {spec!r}: NODES={nodes!r} must be a whole number >= 1, as in {name}:16")
    return cluster_preset(name, int(nodes))


def save_cluster(profile: ClusterProfile, path: str | Path) -> None:
    """Write ``profile`` to ``path`` as JSON (indent 2), readable by ``load_cluster``.

    Args:
        profile: the cluster profile (from ``planner profile``, a preset or ``load_cluster``).
        path: the file to write (replaced if it exists).

    Raises:
        SchemaError: the file cannot be written.
    """
    try:
        Path(path).write_text(profile.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise SchemaError(f"cannot write cluster profile to {str(path)!r}: {e.strerror}") from e


def _load_cluster_file(path: Path) -> ClusterProfile:
    text = read_text(path)
    raw = load_json(text, str(path))
    if isinstance(raw, dict) and raw.get("complete") is False:
        raise SchemaError(
            f"{path} is an incomplete profile ({raw.get('failure', 'no reason recorded')}); "
            "run `planner profile` again once every rank is healthy"
        )
    refuse_other_kind(raw, str(path), "cluster profile")
    where = f"cluster profile {str(path)!r}"
    version = raw.get("schema_version", 1) if isinstance(raw, dict) else None
    if version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise SchemaError(
            f"{where}: schema_version {version!r} is not one this planner reads ({readable}; it writes "
            f"{CLUSTER_SCHEMA_VERSION}); profile the cluster again with `planner profile`"
        )
    try:
        if version == CLUSTER_SCHEMA_VERSION:
            return ClusterProfile.model_validate_json(text)
        return ClusterProfile.model_validate(upgrade(raw))
    except ValidationError as e:
        raise SchemaError(describe(e, where, ClusterProfile)) from e
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from e
