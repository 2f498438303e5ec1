"""Making, writing and reading plan files."""

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from planner.schemas import Alternative, ClusterProfile, ClusterRef, Estimate, Layout, ModelSpec, Plan, TrainingSpec
from planner.schemas.errors import PlannerError, SchemaError
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
    """Bundle a layout and its estimate with the identities of their inputs."""
    ref = ClusterRef(
        spec=cluster_spec,
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
    """Write ``plan`` as indented JSON."""
    Path(path).write_text(plan.model_dump_json(indent=2) + "\n")


def load_plan(path: str | Path) -> Plan:
    """Read a plan file; raises SchemaError naming the file and what is wrong with it."""
    where = Path(path)
    try:
        text = where.read_text()
    except OSError as e:
        raise SchemaError(f"cannot read plan file {str(where)!r}: {e.strerror}") from e
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{where}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise SchemaError(
            f"{where}: schema_version {version!r} is not one this planner reads ({readable}; it writes "
            f"{PLAN_SCHEMA_VERSION}); re-create the plan with `planner search` or `planner estimate --output`"
        )
    try:
        return Plan.model_validate(upgrade(raw))
    except PlannerError as e:  # a bad value, or a layout that cannot split the plan's model
        raise SchemaError(f"{where}: not a valid plan: {e}") from e
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise SchemaError(f"{where}: not a valid plan: {problems}") from e


def check_cluster(plan: Plan, cluster: ClusterProfile) -> None:
    """Warn when ``cluster`` is not the profile the plan was made for (its estimate may be stale)."""
    if cluster_sha256(cluster) != plan.cluster.sha256:
        logger.warning(
            "cluster %r is not the profile the plan was made for (%s); the plan's stored estimate may be stale",
            cluster.name,
            plan.cluster.spec,
        )
