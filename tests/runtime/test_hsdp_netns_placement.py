"""benchmarks/hsdp_netns.py's placement: with two namespaced hosts of two torchrun ranks each,
torch ranks go host by host, so each 2-rank sharding group of the HSDP layout runs on one host,
as the DeviceMap's node numbers say. Needs root and iproute2 (skips otherwise)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import make_cluster

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hsdp_netns", ROOT / "benchmarks" / "hsdp_netns.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hsdp_netns = _load()
REASON = hsdp_netns.netns_hosts.unavailable_reason()
pytestmark = pytest.mark.distributed


def test_the_plan_puts_each_sharding_group_on_one_node() -> None:
    cluster = make_cluster(nodes=2, per_node=2)
    shapes = hsdp_netns.layouts(1)
    assert hsdp_netns.plan_nodes(shapes["hsdp"], cluster) == [[0, 0], [1, 1]]
    assert hsdp_netns.plan_nodes(shapes["zero"], cluster) == [[0, 0, 1, 1]]


@pytest.mark.slow  # one torchrun per host: 6-16 s on this machine's shared cores
@pytest.mark.skipif(REASON is not None, reason=f"namespaced hosts: {REASON}")
def test_torchrun_ranks_go_host_by_host(tmp_path: Path) -> None:
    cluster = make_cluster(nodes=2, per_node=2)
    with hsdp_netns.netns_hosts.NetnsHosts(2) as hosts:
        on_host = hsdp_netns.torch_rank_hosts(hosts, tmp_path, 60.0)
        names = [h.hostname for h in hosts.hosts]
        assert on_host == {0: names[0], 1: names[0], 2: names[1], 3: names[1]}
        assert hsdp_netns.check_placement(hosts, hsdp_netns.layouts(1)["hsdp"], cluster, on_host)
