"""Shared fixtures: small hand-built clusters so cost-model tests do not depend on presets."""

import os
from datetime import datetime

import pytest

from planner.schemas import (
    ClusterProfile,
    DeviceKind,
    DeviceProfile,
    DType,
    LinkMatrix,
    LinkProfile,
    MatmulModel,
    Provenance,
)


def make_cluster(
    *,
    nodes: int = 1,
    per_node: int = 8,
    intra_bw: float = 100e9,
    inter_bw: float = 10e9,
    latency_s: float = 1e-6,
    memory_bytes: int = 80 * 2**30,
) -> ClusterProfile:
    """A uniform cluster with round numbers, for hand-worked expectations."""
    return ClusterProfile(
        name="test",
        num_nodes=nodes,
        devices_per_node=per_node,
        device=DeviceProfile(
            name="test-gpu",
            kind=DeviceKind.CUDA,
            memory_bytes=memory_bytes,
            peak_flop_per_s={DType.BF16: 100e12, DType.FP16: 100e12, DType.FP32: 10e12},
            memory_bandwidth_bytes_per_s=1e12,
            matmul=MatmulModel(peak_fraction=0.5, compute_units=4, tile_m=128, tile_n=128, launch_overhead_s=0.0),
        ),
        intra_node_links=LinkMatrix(
            size=per_node, uniform=LinkProfile(bandwidth_bytes_per_s=intra_bw, latency_s=latency_s)
        ),
        inter_node_links=LinkMatrix(
            size=nodes, uniform=LinkProfile(bandwidth_bytes_per_s=inter_bw, latency_s=latency_s)
        ),
        provenance=Provenance(kind="preset", created=datetime(2026, 1, 1)),
    )


def cpu_cluster(ranks: int) -> ClusterProfile:
    """One node of ``ranks`` CPU ranks with 1 GiB each, named as ``planner profile`` names a CPU,
    for plans that run on this machine."""
    cluster = make_cluster(per_node=ranks, memory_bytes=2**30)
    device = cluster.device.model_copy(update={"name": "cpu (test)", "kind": DeviceKind.CPU})
    return cluster.model_copy(update={"name": "cpu-test", "device": device})


@pytest.fixture
def cluster8() -> ClusterProfile:
    """One node of 8 devices."""
    return make_cluster()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto`` (pyproject.toml's addopts): one per usable core, at least 2 (many
    tests wait on timeouts, stalled ranks and child processes, which another worker fills) and at
    most 4 (a worker's test may fork 8 ranks, each with torch loaded). On the 2-core machine the
    suite went 25 -> 14.5 min with 2 workers taking whole modules. ``-n 0`` runs it in this process."""
    return max(2, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite golden files instead of comparing.")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether the run was asked to rewrite golden files (--update-golden)."""
    return bool(request.config.getoption("--update-golden"))
