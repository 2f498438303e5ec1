"""Plan: a chosen layout with its estimate and the identities of the inputs it was made for.

Written to disk as JSON (``planner.plans.save_plan``); a schema change bumps ``schema_version``
and keeps a reader for the old one.
"""

from datetime import datetime
from typing import Literal

from pydantic import Field

from planner.schemas._base import FrozenModel
from planner.schemas.estimate import Estimate
from planner.schemas.layout import Layout
from planner.schemas.model import ModelSpec
from planner.schemas.training import TrainingSpec


class ClusterRef(FrozenModel):
    """Which cluster profile a plan was made for."""

    spec: str = Field(description="What the user passed: a preset NAME:NODES or a profile file path.")
    name: str
    world_size: int = Field(ge=1)
    num_nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    device_name: str
    sha256: str = Field(description="Hash of the profile's canonical JSON, to notice a changed profile.")


class Alternative(FrozenModel):
    """Another layout the search ranked, kept to explain the choice."""

    layout: Layout
    estimate: Estimate


class Plan(FrozenModel):
    """A layout, what the cost models predict for it, and the inputs both came from."""

    schema_version: Literal[1] = 1
    created: datetime
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterRef
    layout: Layout
    estimate: Estimate
    runner_up: Alternative | None = Field(default=None, description="The next-best layout of the search.")
