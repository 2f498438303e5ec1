"""`planner export`: a plan as another framework's config, priced as that framework runs it.

A plan is priced for the stack it was searched under (``TrainingSpec.stack``); the framework an
export targets runs the layout its own way (``schemas.stacks``). The export re-prices the plan
under the target's stack (``TrainingSpec.under``: the plan's own overrides kept), writes the
config from that training, and returns both estimates where they differ, so a plan searched for
one framework and run on another says what it will cost there.
"""

from dataclasses import dataclass
from pathlib import Path

from planner.export.targets import TARGET_STACKS, export, export_note, export_target
from planner.files.plans import load_plan, plan_cluster
from planner.flows.estimate import estimate
from planner.schemas import Estimate, Plan, StackName
from planner.schemas.errors import OtherProfileError, SchemaError


@dataclass(frozen=True, slots=True, kw_only=True)
class Exported:
    """An export's text and what its target's stack changes of the plan's estimate."""

    text: str
    """The target's config or arguments, written from the plan under the target's stack."""
    plan_stack: StackName
    target_stack: StackName
    planned: Estimate | None = None
    """The plan under its own stack, priced now; None where the target's stack prices it the same
    (the same training) or it could not be priced (``not_priced``)."""
    under_target: Estimate | None = None
    """The plan under the target's stack; None as ``planned``."""
    not_priced: str | None = None
    """Why the plan could not be re-priced (its cluster profile cannot be read); None otherwise."""
    note: str | None = None
    """What the text comes from, to print beside it where the text cannot hold a comment
    (Megatron-LM's arguments); None otherwise."""


def export_plan(plan: Plan | str | Path, target: str, *, cluster: str | None = None) -> Exported:
    """``plan`` as ``target``'s config, priced under ``target``'s stack beside its own.

    Args:
        plan: a Plan or a plan file.
        target: an export target's name (``ExportTarget``).
        cluster: the plan's cluster profile where it is not at the path the plan names (a preset or a file).

    Returns:
        The export and, where the target's stack prices the plan otherwise, both estimates.

    Raises:
        SchemaError: the plan cannot be read, or the target is unknown.
        OtherProfileError: the cluster profile is another cluster's than the plan's (one that cannot be
            read leaves the plan unpriced).
        InfeasibleConfigError: the plan uses a feature the target cannot express.
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
    chosen = export_target(target)
    stack = TARGET_STACKS[chosen]
    training = loaded.training.under(stack)
    moved = loaded.model_copy(update={"training": training})
    note = export_note(loaded, chosen)
    if training == loaded.training:
        return Exported(text=export(moved, chosen), plan_stack=loaded.training.stack, target_stack=stack, note=note)
    try:
        profile = plan_cluster(loaded, cluster)
    except OtherProfileError:
        raise
    except SchemaError as e:  # the config is still written: the figures in it are the plan's own
        return Exported(
            text=export(moved, chosen),
            plan_stack=loaded.training.stack,
            target_stack=stack,
            not_priced=str(e),
            note=note,
        )
    assert profile is not None  # required: a missing profile raises
    under_target = estimate(loaded.model, profile, training, loaded.layout)
    priced = moved.model_copy(update={"estimate": under_target})
    return Exported(
        text=export(priced, chosen),
        plan_stack=loaded.training.stack,
        target_stack=stack,
        planned=estimate(loaded.model, profile, loaded.training, loaded.layout),
        under_target=under_target,
        note=export_note(priced, chosen),
    )


def export_text(plan: Plan | str | Path, target: str) -> str:
    """A plan as another training framework's config or arguments, written from the plan under
    that framework's stack (``export_plan``; ``planner.export`` holds the writers).

    Args:
        plan: a Plan or a plan file.
        target: "torchtitan" (a TOML job config), "megatron" (Megatron-LM arguments) or
            "deepspeed" (a JSON config), or an ``ExportTarget``.

    Returns:
        The export's text, ready to write to a file.

    Raises:
        SchemaError: the plan cannot be read, or the target is unknown.
        InfeasibleConfigError: the plan uses a feature the target cannot express (one line
            naming it, why, and what to plan instead); nothing is dropped silently.
    """
    return export_plan(plan, target).text
