"""benchmarks/frontier_partitioning.py: the 20B GPT of Xu et al.'s Frontier runs and ZeRO-3's
partitions over the frontier-mi250x preset's three link levels."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from frontier_partitioning import LAYOUTS, frontier, neox_20b, row

from cost_models.estimate import estimate
from cost_models.params import total_params
from planner.schemas import DType, TrainingSpec


def test_the_assumed_model_is_gpt_neox_20b() -> None:
    # Black et al. 2022, Table 1: 20,554,567,680 parameters.
    assert total_params(neox_20b()) == 20_554_567_680


def _exposed_dp_comm_s(rail_bytes_per_s: float | None = None) -> dict[str, float]:
    cluster = frontier(6, rail_bytes_per_s)
    # Gradients summed in bf16, as gathered: the HSDP/hpZ equality below is of equal bytes.
    training = TrainingSpec(global_batch_size=48, seq_len=2048, grad_reduce_dtype=DType.BF16)
    model = neox_20b()
    return {
        name: row(name, make(48, 1), estimate(model, training, cluster, make(48, 1)), cluster).exposed_dp_comm_s
        for name, make in LAYOUTS.items()
    }


def test_keeping_the_gathers_nearer_exposes_less_communication() -> None:
    exposed = _exposed_dp_comm_s()
    assert exposed["zero3"] > exposed["hpz-node"] > exposed["hpz-gpu"]
    # HSDP over a node keeps its gathers inside the node but all-reduces the shard between the
    # replicas over one rail each (12 GB/s), where hpZ over one GPU's gathers across nodes run as
    # one ring as fast as a ring inside a node (39 GB/s; a node's 8 rails carry 96 at once): HSDP
    # exposes more.
    assert exposed["hsdp-node+gpu"] > exposed["hpz-gpu"]


def test_a_slower_network_widens_the_gap_the_partitions_close() -> None:
    preset, slow = _exposed_dp_comm_s(), _exposed_dp_comm_s(3e9)
    assert slow["zero3"] - slow["hpz-gpu"] > preset["zero3"] - preset["hpz-gpu"] > 0


def test_hsdp_over_a_node_holds_an_eighth_of_the_model_states_and_does_not_fit() -> None:
    cluster = frontier(6)
    training = TrainingSpec(global_batch_size=48, seq_len=2048)
    layout = LAYOUTS["hsdp-node+gpu"](48, 1)
    result = row("hsdp-node+gpu", layout, estimate(neox_20b(), training, cluster, layout), cluster)
    # 16 bytes of Adam states per parameter over 8 GCDs: 20.55e9 x 16 / 8 = 41.1e9 bytes alone.
    assert result.peak_memory_gib > 20_554_567_680 * 16 / 8 / 2**30
    assert not result.fits
