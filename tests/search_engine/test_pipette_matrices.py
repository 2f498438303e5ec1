"""Pipette's published mpiGraph node matrices (tests/fixtures/pipette) as the planner's node links,
and the device-mapping refiner on them (benchmarks/pipette_matrices.py, pipette_mapping.py)."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from pipette_mapping import pipette_gpt, pipette_training
from pipette_matrices import RUNS, Table, measured_cluster, read_run

from planner.files.clusters import load_cluster
from planner.schemas import DType, Layout, Recompute, ZeroStage
from planner.schemas.device_map import IDENTITY
from planner.schemas.settings import Budget
from planner.search_engine.device_mapping import DeviceMappingRefiner
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Candidate

OFF_DIAGONAL = ~np.eye(16, dtype=bool)


@pytest.mark.parametrize("name", RUNS)
def test_each_run_holds_two_16_node_tables_of_one_rail_in_mib_per_s(name: str) -> None:
    run = read_run(name)
    assert run.source["repository"] == "https://github.com/yimjinkyu1/date2024_pipette"
    assert run.source["units"].startswith("MiB/s")
    assert len(run.hosts) == len(set(run.hosts)) == 16
    for table in Table:
        bandwidth = run.src_dst_bytes_per_s(table)
        assert bandwidth.shape == (16, 16)
        # One 200 Gb/s HDR rail: positive, below its 25 GB/s line rate, above half of it.
        assert (bandwidth[OFF_DIAGONAL] > 12.5e9).all()
        assert (bandwidth[OFF_DIAGONAL] < 25e9).all()


@pytest.mark.parametrize("name", RUNS)
def test_the_recv_table_transposed_is_the_send_table(name: str) -> None:
    """Both tables time the same transfers, at the receiver and at the sender: read [src][dst],
    they agree link by link (median 0.1%, at most 4%); read as written they would not (3%)."""
    run = read_run(name)
    recv, send = run.src_dst_bytes_per_s(Table.RECV), run.src_dst_bytes_per_s(Table.SEND)
    relative = np.abs(recv - send)[OFF_DIAGONAL] / send[OFF_DIAGONAL]
    assert np.median(relative) < 0.005
    assert relative.max() < 0.05
    as_written = np.abs(run.recv_mib_per_s - run.send_mib_per_s)[OFF_DIAGONAL] / run.send_mib_per_s[OFF_DIAGONAL]
    assert np.median(as_written) > 0.02


def test_a_measured_cluster_keeps_the_preset_and_reads_links_src_to_dst_in_bytes() -> None:
    base = load_cluster("dgx-a100-80g:16")
    run = read_run("time_0")
    recv = measured_cluster(base, run, Table.RECV)
    send = measured_cluster(base, run, Table.SEND)
    # Recv row 0 (node 0 receiving), column 1 (from node 1): 19,635.3585 MiB/s = 20.589e9 B/s.
    assert recv.inter_node_links.link(1, 0).bandwidth_bytes_per_s == pytest.approx(20.5892e9, rel=1e-5)
    # Send row 0 (node 0 sending), column 1 (to node 1): 16,716.878 MiB/s = 17.529e9 B/s.
    assert send.inter_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(17.5288e9, rel=1e-5)
    assert send.inter_node_links.link(0, 1).latency_s == 2.7e-6  # the preset's
    assert (send.device, send.intra_node_links, send.world_size) == (base.device, base.intra_node_links, 128)
    assert any("yimjinkyu1/date2024_pipette" in s for s in send.provenance.sources)
    with pytest.raises(ValueError, match="16 nodes"):
        measured_cluster(load_cluster("dgx-a100-80g:8"), run, Table.SEND)


LAYOUTS = (
    Layout(
        data_parallel_degree=64,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=2,
        zero_stage=ZeroStage.GRADIENTS,
        recompute=Recompute.NONE,
        sequence_parallel=True,
    ),
    Layout(
        data_parallel_degree=32,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        micro_batch_size=2,
        zero_stage=ZeroStage.OPTIMIZER,
        recompute=Recompute.NONE,
    ),
    Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=8,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.NONE,
        recompute=Recompute.NONE,
    ),
)


@pytest.mark.parametrize("table", Table)
@pytest.mark.parametrize("name", RUNS)
def test_the_mapping_is_never_slower_than_the_identity_on_the_measured_links(name: str, table: Table) -> None:
    cluster = measured_cluster(load_cluster("dgx-a100-80g:16"), read_run(name), table)
    evaluate = Evaluator(pipette_gpt(), pipette_training(DType.FP16), cluster)
    for layout in LAYOUTS:
        identity = Candidate(layout, evaluate(layout))
        mapped = DeviceMappingRefiner().refine(identity, evaluate, Budget(), seed=0)
        assert mapped.estimate.step_time_s <= identity.estimate.step_time_s
        # The refiner's price is the Evaluator's for its map; the identity's is the layout's own.
        assert evaluate(mapped.layout).step_time_s == mapped.estimate.step_time_s
        assert evaluate(replace(mapped.layout, device_map=IDENTITY)).step_time_s == identity.estimate.step_time_s


def test_the_mapping_moves_data_parallel_rings_off_the_slowest_link() -> None:
    """time_0's Send table: its slowest link, 8 -> 9 at 16,361.73 MiB/s = 17.157e9 B/s, lies on
    the identity ring through the 16 nodes; the refiner's node order avoids it, and the dp64 tp2
    layout (gradient rings over all 16 nodes) steps 0.4264 s -> 0.3989 s, 6.5% faster."""
    cluster = measured_cluster(load_cluster("dgx-a100-80g:16"), read_run("time_0"), Table.SEND)
    links = cluster.inter_node_links
    assert links.ring_slowest(range(16)).bandwidth_bytes_per_s == pytest.approx(17.1565e9, rel=1e-5)
    assert links.link(8, 9).bandwidth_bytes_per_s == pytest.approx(17.1565e9, rel=1e-5)
    evaluate = Evaluator(pipette_gpt(), pipette_training(DType.FP16), cluster)
    identity = Candidate(LAYOUTS[0], evaluate(LAYOUTS[0]))
    mapped = DeviceMappingRefiner().refine(identity, evaluate, Budget(), seed=0)
    order = mapped.layout.device_map.devices[::8]
    nodes = tuple(d // 8 for d in order)
    assert sorted(nodes) == list(range(16))
    assert links.ring_slowest(nodes).bandwidth_bytes_per_s > 19e9
    gain = 1 - mapped.estimate.step_time_s / identity.estimate.step_time_s
    assert gain > 0.04
