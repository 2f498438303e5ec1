"""A checkpoint's metadata (``runtime.checkpoint``), read without torch: which checkpoint of a
folder is the newest complete one, and whether a plan can resume from it (``planner replan``
checks before any job starts)."""

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from planner.schemas import Layout, ModelSpec
from planner.schemas.errors import InfeasibleConfigError, SchemaError

LATEST = "latest"
META = "meta.json"
CHECKPOINT_PREFIX = "step-"
"""A checkpoint's folder is this and its step count in 8 digits (``.partial`` while it is written)."""


def model_sha256(model: ModelSpec) -> str:
    """The model's identity: a checkpoint resumes into the same architecture only."""
    return hashlib.sha256(model.model_dump_json().encode()).hexdigest()


def layout_json(layout: Layout) -> dict[str, Any]:
    """A layout as the metadata records it."""
    recorded: dict[str, Any] = TypeAdapter(Layout).dump_python(layout, mode="json")
    return recorded


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    pointer = directory / LATEST
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text().strip()
    return path if (path / META).is_file() else None


def check_loadable(
    directory: Path,
    model: ModelSpec,
    global_batch_size: int,
    *,
    otherwise: str = "run without --resume to start afresh",
) -> dict[str, Any]:
    """The newest complete checkpoint's metadata, if a run of ``model`` at ``global_batch_size``
    can resume from it (under any layout). ``otherwise``: the caller's fix where there is none
    (``planner run --resume`` and ``planner replan --checkpoint-dir`` have different ones).

    Raises:
        SchemaError: no complete checkpoint there.
        InfeasibleConfigError: it was taken for another model or global batch size.
    """
    if not directory.is_dir():
        state = "is not a folder" if directory.exists() else "does not exist"
        raise SchemaError(f"the checkpoint folder {str(directory)!r} {state}; {otherwise}")
    path = latest(directory)
    if path is None:
        raise SchemaError(f"no complete checkpoint in {str(directory)!r}; {otherwise}")
    meta: dict[str, Any] = json.loads((path / META).read_text())
    if "model_sha256" not in meta:
        raise InfeasibleConfigError(
            f"the checkpoint {str(path)!r} is in the older per-rank form, which only the planner that wrote it "
            "resumes; resume it with that version"
        )
    if meta.get("model_sha256") != model_sha256(model):
        raise InfeasibleConfigError(
            f"the checkpoint {str(path)!r} was taken for model {meta.get('model_name')!r}, not this plan's "
            f"{model.name!r}; resume with a plan for that model"
        )
    if meta.get("global_batch_size") != global_batch_size:
        raise InfeasibleConfigError(
            f"the checkpoint {str(path)!r} was taken at global batch size {meta.get('global_batch_size')}, not this "
            f"plan's {global_batch_size}; re-plan with the same global batch size (planner replan)"
        )
    return meta


def check_steps_left(done_steps: int, steps: int) -> None:
    """Refuse a resumed run that asks for no more steps than its checkpoint has done (``--steps``
    counts from the start of training, not from the checkpoint).

    Raises:
        InfeasibleConfigError: naming both counts and the fix.
    """
    if done_steps >= steps:
        raise InfeasibleConfigError(
            f"the checkpoint has {done_steps} steps done, and --steps {steps} asks for no more; "
            f"give --steps above {done_steps}"
        )


def prune(directory: Path, keep_last: int, *, keep: Path | None = None) -> list[Path]:
    """Remove the complete checkpoints of ``directory`` older than its newest ``keep_last``: a
    checkpoint is some hundred MB to many GB, and a run that takes one every few steps fills its
    disk. Never removed: a ``.partial`` folder (being written, or left by a killed job), the one
    ``latest`` names, and ``keep`` (the one the run resumed from).

    Returns:
        The folders removed, oldest first.
    """
    complete = sorted(
        path
        for path in directory.glob(f"{CHECKPOINT_PREFIX}*")
        if path.is_dir() and not path.name.endswith(".partial") and (path / META).is_file()
    )  # 8-digit steps: the names sort as the steps do
    spared = {latest(directory), keep}
    removed = [path for path in complete[: max(len(complete) - keep_last, 0)] if path not in spared]
    for path in removed:
        shutil.rmtree(path)
    return removed
