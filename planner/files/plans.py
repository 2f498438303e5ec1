"""Making, writing and reading plan files.

A plan made on a measured cluster names its profile file (``plan.cluster.spec``), and a plan file
must still open it from another working directory, and once copied. So the path is kept as:

- in a Plan object: absolute (``make_plan`` resolves it from the working directory it was given in);
- in a plan file: relative to the plan file's folder when the profile lies in that folder or
  below it (the plan and its profile travel together, as ``out/plan.json`` beside
  ``out/cluster.json``); absolute otherwise (the plan file can then be copied alone on the machine);
- read back: a relative path is looked up beside the plan file first, then from the working
  directory (plan files written before stored the path as typed, relative to where planner ran).

A preset (``dgx-h100:8``) is kept as given.
"""

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from planner.files.clusters import load_cluster
from planner.files.kinds import refuse_other_kind
from planner.files.reading import load_json
from planner.schemas import Alternative, ClusterProfile, ClusterRef, Estimate, Layout, ModelSpec, Plan, TrainingSpec
from planner.schemas.errors import OtherProfileError, PlannerError, SchemaError
from planner.schemas.plan import PLAN_SCHEMA_VERSION, READABLE_VERSIONS, upgrade

logger = logging.getLogger(__name__)


def cluster_sha256(cluster: ClusterProfile) -> str:
    """SHA-256 of the profile's canonical JSON (sorted keys; an absent calibration left out, so a
    profile keeps its identity from before calibration existed until it is calibrated)."""
    data = cluster.model_dump(mode="json", exclude={"calibration"} if cluster.calibration is None else None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def make_plan(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    cluster_spec: str,
    layout: Layout,
    estimate: Estimate,
    runner_up: Alternative | None = None,
) -> Plan:
    """Bundle a layout and its estimate with the identities of their inputs (a profile file's path
    made absolute: see the module's docstring).

    Args:
        model: the model planned.
        training: the training it was priced for.
        cluster: the cluster profile it was priced on.
        cluster_spec: how the cluster was given (a preset ``NAME:NODES`` or a profile path), recorded
            so that the plan's cluster can be read again.
        layout: the layout.
        estimate: the layout's estimate.
        runner_up: the next-best layout and how it compares; None where there is none.

    Returns:
        The plan, created now.
    """
    ref = ClusterRef(
        spec=str(Path(cluster_spec).resolve()) if _names_a_file(Path(cluster_spec)) else cluster_spec,
        name=cluster.name,
        world_size=cluster.world_size,
        num_nodes=cluster.num_nodes,
        devices_per_node=cluster.devices_per_node,
        device_name=cluster.device.name,
        device_kind=cluster.device.kind,
        sha256=cluster_sha256(cluster),
    )
    return Plan(
        created=datetime.now(UTC),
        model=model,
        training=training,
        cluster=ref,
        layout=layout,
        estimate=estimate,
        runner_up=runner_up,
    )


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as indented JSON, its profile file's path relative to ``path``'s folder when
    the profile lies there or below, absolute otherwise (see the module's docstring).

    Args:
        plan: the plan.
        path: the file to write (replaced if it exists).

    Raises:
        SchemaError: the file cannot be written.
    """
    where = Path(path)
    spec = Path(plan.cluster.spec)
    if _names_a_file(spec):
        profile, folder = spec.resolve(), where.resolve().parent
        stored = profile.relative_to(folder).as_posix() if profile.is_relative_to(folder) else str(profile)
        plan = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"spec": stored})})
    try:
        where.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise SchemaError(f"cannot write the plan to {str(where)!r}: {e.strerror}") from e


def load_plan(path: str | Path) -> Plan:
    """Read a plan file (any readable schema version).

    Args:
        path: the plan file (from ``planner search`` or ``save_plan``).

    Returns:
        The plan.

    Raises:
        SchemaError: naming the file and what is wrong with it.
    """
    return read_plan(path)[0]


def read_plan(path: str | Path) -> tuple[Plan, str]:
    """Read a plan file once: the plan, and the SHA-256 of the file's bytes (a run report records it).

    Args:
        path: the plan file.

    Returns:
        The plan and the file's SHA-256 (hex).

    Raises:
        SchemaError: naming the file and what is wrong with it.
    """
    where = Path(path)
    try:
        data = where.read_bytes()
        text = data.decode("utf-8")
    except OSError as e:
        raise SchemaError(f"cannot read plan file {str(where)!r}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise SchemaError(
            f"{where} is not a plan file: byte {e.start} is not UTF-8 text; give a plan.json from planner search"
        ) from e
    raw = load_json(text, str(where))
    refuse_other_kind(raw, str(where), "plan")
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise SchemaError(
            f"{where}: schema_version {version!r} is not one this planner reads ({readable}; it writes "
            f"{PLAN_SCHEMA_VERSION}); re-create the plan with `planner search` or `planner estimate --output`"
        )
    try:
        plan = Plan.model_validate(upgrade(raw))
    except PlannerError as e:  # a bad value, or a layout that cannot split the plan's model
        raise SchemaError(f"{where}: not a valid plan: {e}") from e
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise SchemaError(f"{where}: not a valid plan: {problems}") from e
    return _profile_found(plan, where), hashlib.sha256(data).hexdigest()


def _names_a_file(spec: Path, *folders: Path) -> bool:
    """Whether a cluster spec is a profile file rather than a preset (``inputs.load_cluster``'s rule),
    looking for the file from the working directory and from ``folders``."""
    return spec.suffix.lower() == ".json" or any((folder / spec).is_file() for folder in (Path(), *folders))


def _profile_found(plan: Plan, plan_path: Path) -> Plan:
    """``plan`` with its profile file's relative path resolved: beside the plan file, or else (a
    plan file written before this rule) from the working directory."""
    spec = Path(plan.cluster.spec)
    folder = plan_path.resolve().parent
    if spec.is_absolute() or not _names_a_file(spec, folder):
        return plan
    beside = folder / spec
    found = spec.resolve() if not beside.is_file() and spec.is_file() else beside.resolve()
    return plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"spec": str(found)})})


def plan_cluster(plan: Plan, spec: str | None = None, *, required: bool = True) -> ClusterProfile | None:
    """The plan's cluster profile: ``spec`` (a ``--cluster`` that points the plan at its profile) or
    the one the plan names, checked against the hash the plan keeps (``check_plan_profile``).

    Args:
        plan: the plan.
        spec: a preset or profile file to use instead of the plan's own.
        required: whether a plan's profile file that is missing is an error; otherwise None (a
            command that reads the profile only to check it goes on without it).

    Raises:
        SchemaError: the profile is missing (``required``), cannot be read, or is another cluster's.
    """
    where = plan.cluster.spec if spec is None else spec
    if spec is None and _names_a_file(Path(where)) and not Path(where).is_file():
        if not required:
            return None
        raise SchemaError(
            f"the plan's cluster profile {where!r} is missing (a plan names its profile file, it does not hold it);"
            " copy the profile to that path, or pass --cluster PROFILE.json"
        )
    cluster = load_cluster(where)
    check_plan_profile(plan, cluster, where)
    return cluster


def check_plan_profile(plan: Plan, cluster: ClusterProfile, where: str) -> None:
    """Refuse ``cluster`` (read from ``where``) when it is another cluster than the plan's; warn when it is
    the same cluster (name, devices, shape) whose figures changed since the plan was made: re-measured
    or recalibrated, so the plan's stored estimate may be stale but the plan still applies.

    Raises:
        SchemaError: naming both profiles and the fix.
    """
    ref = plan.cluster
    if cluster_sha256(cluster) == ref.sha256:
        return
    shape = (cluster.name, cluster.world_size, cluster.num_nodes, cluster.devices_per_node, cluster.device.name)
    if shape == (ref.name, ref.world_size, ref.num_nodes, ref.devices_per_node, ref.device_name):
        logger.warning(
            "cluster profile %s was re-measured or recalibrated since the plan was made (same %d x %s, other"
            " figures); the plan's stored estimate may be stale: `planner estimate --plan` prices it again",
            where,
            ref.world_size,
            ref.device_name,
        )
        return
    raise OtherProfileError(
        f"{where!r} is another cluster profile than the plan's: the plan was made for {ref.name!r}"
        f" ({ref.world_size} x {ref.device_name}, from {ref.spec}), this is {cluster.name!r} ({cluster.world_size}"
        f" x {cluster.device.name}); pass --cluster with the plan's profile, or plan for this cluster with"
        f" `planner replan PLAN -c {where}`"
    )


def check_cluster(plan: Plan, cluster: ClusterProfile) -> None:
    """Warn when ``cluster`` is not the profile the plan was made for (its estimate may be stale)."""
    if cluster_sha256(cluster) != plan.cluster.sha256:
        logger.warning(
            "cluster %r is not the profile the plan was made for (%s); the plan's stored estimate may be stale",
            cluster.name,
            plan.cluster.spec,
        )
