"""Pipette's published mpiGraph node bandwidth matrices as a cluster's node matrix.

Pipette (Yim et al., DATE 2024) published two mpiGraph runs over 16 A100 nodes with its code
(github.com/yimjinkyu1/date2024_pipette); ``tests/fixtures/pipette`` keeps them, with their
source and units in each file and in its README. Each run holds two matrices: mpiGraph's Recv
table (row = receiving node) and its Send table (row = sending node), in MiB/s, each entry one
InfiniBand adapter's bandwidth, which is what ``ClusterProfile.inter_node_links`` holds (one
rail per device).

``read_run`` reads a file; ``node_links`` turns one of its matrices into a [src][dst]
``LinkMatrix`` in bytes/s (the Recv table transposed); ``measured_cluster`` puts it into a
cluster of 16 nodes built from a preset, keeping the preset's link latency (mpiGraph measures
bandwidth only).
"""

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import numpy.typing as npt

from planner.schemas import ClusterProfile, LinkMatrix

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipette"
RUNS = ("time_0", "time_1")
"""The published runs, by file stem."""
MIB = 2**20
"""mpiGraph's "MB": it divides bytes by 1024 x 1024."""
NODES = 16


class Table(StrEnum):
    """Which of mpiGraph's two tables: the bandwidth each receiver saw, or each sender."""

    RECV = "recv"
    SEND = "send"


KEYS = {Table.RECV: "0", Table.SEND: "1"}
"""Each table's key in the source's JSON (its log_to_csv.py writes Recv as 0, Send as 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MpiGraphRun:
    """One published mpiGraph run: the nodes' host names and both tables as written (MiB/s)."""

    name: str
    hosts: tuple[str, ...]
    recv_mib_per_s: npt.NDArray[np.float64]
    """Row = receiving node, column = sending node."""
    send_mib_per_s: npt.NDArray[np.float64]
    """Row = sending node, column = receiving node."""
    source: dict[str, str]

    def src_dst_bytes_per_s(self, table: Table) -> npt.NDArray[np.float64]:
        """The table as [src][dst] bandwidth in bytes/s (the Recv table transposed); the diagonal
        (the source's filler, no measurement) is kept as written."""
        mib = self.recv_mib_per_s.T if table is Table.RECV else self.send_mib_per_s
        return mib * MIB


def read_run(name: str, folder: Path = FIXTURES) -> MpiGraphRun:
    """Read ``<folder>/<name>.json`` (a published run with its ``source``).

    Raises:
        ValueError: a table that is not square over the run's hosts, or both tables over
            different hosts.
    """
    raw = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    tables = {table: raw[key] for table, key in KEYS.items()}
    hosts = tuple(tables[Table.RECV]["gpus"])
    if tuple(tables[Table.SEND]["gpus"]) != hosts:
        raise ValueError(f"{name}: the Recv and Send tables name different hosts")
    arrays = {}
    for table, body in tables.items():
        array = np.array(body["bandwidth"], dtype=np.float64)
        if array.shape != (len(hosts), len(hosts)):
            raise ValueError(f"{name}: the {table} table is {array.shape}, not {len(hosts)} x {len(hosts)}")
        arrays[table] = array
    return MpiGraphRun(
        name=name,
        hosts=hosts,
        recv_mib_per_s=arrays[Table.RECV],
        send_mib_per_s=arrays[Table.SEND],
        source=dict(raw["source"]),
    )


def node_links(run: MpiGraphRun, table: Table, latency_s: float) -> LinkMatrix:
    """``table`` of ``run`` as an explicit node matrix: [src][dst] bytes/s, every link ``latency_s``."""
    bandwidth = run.src_dst_bytes_per_s(table)
    n = len(run.hosts)
    return LinkMatrix(
        size=n,
        bandwidth_bytes_per_s=tuple(tuple(row) for row in bandwidth.tolist()),
        latency_s=tuple((latency_s,) * n for _ in range(n)),
    )


def measured_cluster(base: ClusterProfile, run: MpiGraphRun, table: Table) -> ClusterProfile:
    """``base`` (as many nodes as the run, uniform node links) with the run's ``table`` as its
    node matrix and the base's link latency on every pair.

    Raises:
        ValueError: ``base`` has another number of nodes or non-uniform node links.
    """
    uniform = base.inter_node_links.uniform
    if base.num_nodes != len(run.hosts) or uniform is None:
        raise ValueError(
            f"the base cluster must have {len(run.hosts)} nodes joined by uniform links, "
            f"not {base.num_nodes} nodes ({'uniform' if uniform else 'explicit'} links)"
        )
    provenance = base.provenance.model_copy(
        update={
            "sources": (
                *base.provenance.sources,
                f"node links: mpiGraph {table} table of {run.source['repository']} {run.source['path']} "
                f"at {run.source['commit']} ({run.source['units']}); latency {uniform.latency_s} s from the preset",
            ),
            "hosts": run.hosts,
        }
    )
    return base.model_copy(
        update={
            "name": f"{base.name}+pipette-{run.name}-{table}",
            "inter_node_links": node_links(run, table, uniform.latency_s),
            "provenance": provenance,
        }
    )
