"""The export targets and one entry point: a plan as the config or arguments of another
training framework (``planner export plan.json --to torchtitan|megatron|deepspeed``)."""

from collections.abc import Callable
from enum import StrEnum

from planner.export import deepspeed, megatron, torchtitan
from planner.export.deepspeed import deepspeed_json
from planner.export.megatron import megatron_note, megatron_text
from planner.export.torchtitan import torchtitan_toml
from planner.schemas import Plan, StackName
from planner.schemas.errors import SchemaError
from planner.schemas.plan import PlanShape


class ExportTarget(StrEnum):
    """Training frameworks a plan exports to, and what each export is."""

    TORCHTITAN = "torchtitan"
    """A job config (TOML) for torchtitan.train."""
    MEGATRON = "megatron"
    """Command-line arguments for Megatron-LM's pretrain_gpt.py."""
    DEEPSPEED = "deepspeed"
    """A DeepSpeed config (JSON)."""


TARGET_FILES = {
    ExportTarget.TORCHTITAN: "job.toml",
    ExportTarget.MEGATRON: "megatron.args",
    ExportTarget.DEEPSPEED: "ds_config.json",
}
"""A file name for each target's export, suggested where ``--output`` names a folder."""


TARGET_STACKS = {
    ExportTarget.TORCHTITAN: StackName.TORCHTITAN,
    ExportTarget.MEGATRON: StackName.MEGATRON_LM,
    ExportTarget.DEEPSPEED: StackName.DEEPSPEED,
}
"""The stack each target runs a plan with (``schemas.stacks``): what its export is priced under."""


STACK_CHECKS: dict[StackName, Callable[[PlanShape], None]] = {
    StackName.TORCHTITAN: torchtitan.check,
    StackName.MEGATRON_LM: megatron.check,
    StackName.DEEPSPEED: deepspeed.check,
}
"""What each stack with an export refuses: a search for that stack leaves those layouts out."""


def export_target(target: ExportTarget | str) -> ExportTarget:
    """The export target named ``target``.

    Raises:
        SchemaError: ``target`` is not a known target (the message lists them).
    """
    try:
        return ExportTarget(target)
    except ValueError as e:
        known = ", ".join(t.value for t in ExportTarget)
        raise SchemaError(f"export target {target!r} is not one of {known}") from e


def export(plan: Plan, target: ExportTarget | str) -> str:
    """The plan as ``target``'s config or arguments, as text to write to a file, from the plan's
    training as it is (``flows.export.export_plan`` first re-prices it under the target's stack).

    Args:
        plan: the plan to export.
        target: an ``ExportTarget`` or its name.

    Returns:
        The TOML (torchtitan), shell arguments (megatron) or JSON (deepspeed) text.

    Raises:
        SchemaError: ``target`` is not a known target.
        InfeasibleConfigError: the plan uses a feature the target cannot express; the one-line
            message names it, why, and what to plan instead.
    """
    chosen = export_target(target)
    writers = {
        ExportTarget.TORCHTITAN: torchtitan_toml,
        ExportTarget.MEGATRON: megatron_text,
        ExportTarget.DEEPSPEED: deepspeed_json,
    }
    return writers[chosen](plan)


def export_note(plan: Plan, target: ExportTarget | str) -> str | None:
    """What ``target``'s export of ``plan`` comes from, where its text cannot carry a comment
    (Megatron-LM's arguments, which must paste as they are); None where the text says it itself.

    Raises:
        SchemaError: ``target`` is not a known target.
    """
    return megatron_note(plan) if export_target(target) is ExportTarget.MEGATRON else None
