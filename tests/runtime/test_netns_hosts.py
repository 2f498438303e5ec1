"""scripts/netns_hosts.py: namespaced hosts on one bridge with a rate-limited pair. Gloo across
the hosts (rendezvous at host 0's address) finds the slowed pair slower than an unshaped one, and
teardown leaves no namespace behind, also when the body raises. Needs root and iproute2."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "netns_pair_probe.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("netns_hosts", ROOT / "scripts" / "netns_hosts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


netns_hosts = _load()
REASON = netns_hosts.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"namespaced hosts: {REASON}")
pytestmark = pytest.mark.distributed


def _ours(prefix: str) -> list[str]:
    return [name for name in netns_hosts.list_namespaces() if name.startswith(prefix + "-")]


@needs_netns
def test_the_slowed_pair_is_slower_under_gloo() -> None:
    # 3 hosts, 0-1 limited to 50 Mbit/s (6.25e6 bytes/s), 0-2 unshaped. 2 MB ping-pongs: about
    # 0.33 s each over the slow pair, milliseconds over a veth.
    with netns_hosts.NetnsHosts(3, {(0, 1): 50}) as hosts:
        env = {"WORLD_SIZE": "3", "MASTER_ADDR": hosts.hosts[0].address, "MASTER_PORT": "29500"}
        procs = [
            hosts.popen(
                i,
                [sys.executable, str(PROBE), "--bytes", "2000000", "--repeats", "3"],
                {**env, "RANK": str(i)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(3)
        ]
        outputs = [p.communicate(timeout=60) for p in procs]
        for i, (p, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
            assert p.returncode == 0, f"host {i} failed:\n{err}"
    bandwidth = {int(k): v for k, v in json.loads(outputs[0][0]).items()}
    slow, fast = bandwidth[1], bandwidth[2]
    print(f"0<->1 (50 Mbit/s): {slow / 1e6:.2f} MB/s; 0<->2 (unshaped): {fast / 1e6:.2f} MB/s")
    # The rate limit holds (htb may let a burst through: up to 20 % over 6.25 MB/s) ...
    assert slow < 6.25e6 * 1.2
    # ... and the unshaped pair is far faster.
    assert fast > 5 * slow


@needs_netns
def test_shaping_is_per_pair_and_both_directions() -> None:
    with netns_hosts.NetnsHosts(3, {(2, 0): 50}, default_rate_mbit=1000) as hosts:
        assert hosts.slow_links == {(0, 2): 50}
        assert hosts.peer_rates_mbit(0) == {2: 50}
        assert hosts.peer_rates_mbit(2) == {0: 50}
        assert hosts.peer_rates_mbit(1) == {}
        shown = hosts.run(2, ["tc", "filter", "show", "dev", "eth0"], timeout_s=10).stdout
        assert "0ad50001/ffffffff" in shown  # 10.213.0.1, host 0's address, as u32 matches it
        classes = hosts.run(1, ["tc", "class", "show", "dev", "eth0"], timeout_s=10).stdout
        assert "class htb 1:1 root" in classes and "rate 1Gbit" in classes  # the default rate only
        assert "50Mbit" not in classes
        assert hosts.run(1, ["hostname"], timeout_s=10).stdout.strip() == f"{hosts.prefix}-h1"


@needs_netns
def test_each_host_runs_on_its_share_of_the_cores() -> None:
    cores = sorted(os.sched_getaffinity(0))
    n = 2 * len(cores)  # more hosts than cores: one core each, in turn
    with netns_hosts.NetnsHosts(n) as hosts:
        probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
        seen = [json.loads(hosts.run(h, probe, timeout_s=10).stdout) for h in range(n)]
    assert seen == [[cores[h % len(cores)]] for h in range(n)]
    with netns_hosts.NetnsHosts(1) as hosts:  # one host: the whole machine
        assert hosts.host_cores(0) == set(cores)


@needs_netns
def test_teardown_leaves_nothing_even_after_an_exception() -> None:
    hosts = netns_hosts.NetnsHosts(2, {(0, 1): 10})
    with pytest.raises(RuntimeError, match="boom"), hosts:
        assert len(_ours(hosts.prefix)) == 3  # two hosts and the switch
        # A launcher with a worker, as torchrun has: the worker must go too.
        launcher = hosts.popen(0, ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        worker = int(launcher.stdout.readline())
        raise RuntimeError("boom")
    assert _ours(hosts.prefix) == []
    assert launcher.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


@needs_netns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_tears_down(signum: int) -> None:
    # A process that builds hosts, says its prefix, then waits: the signal removes its namespaces
    # and still ends the process as the signal would (SIGTERM kills it; SIGINT raises KeyboardInterrupt).
    script = (
        f"import sys, time; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import netns_hosts\n"
        "with netns_hosts.NetnsHosts(2, {(0, 1): 10}) as h:\n"
        "    print(h.prefix, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    assert len(_ours(prefix)) == 3
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=20)
    assert _ours(prefix) == []
    if signum == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM
    else:
        assert "KeyboardInterrupt" in err


def test_bad_links_are_refused() -> None:
    with pytest.raises(ValueError, match="two different hosts"):
        netns_hosts.NetnsHosts(2, {(0, 2): 10})
    with pytest.raises(ValueError, match="positive"):
        netns_hosts.NetnsHosts(2, {(0, 1): 0})


@needs_netns
def test_down_removes_an_orphans_namespaces_only() -> None:
    orphan = netns_hosts.new_prefix(owner_pid=2**22 + 1)  # above pid_max's default: never alive
    subprocess.run(["ip", "netns", "add", f"{orphan}-h0"], check=True)
    with netns_hosts.NetnsHosts(1) as live:
        removed = netns_hosts.down()
        assert f"{orphan}-h0" in removed
        assert len(_ours(live.prefix)) == 2  # a live run's hosts stay
    assert _ours(orphan) == []


def test_the_reason_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns_hosts.os, "geteuid", lambda: 1000)
    assert netns_hosts.unavailable_reason() == "needs root (network namespaces, veths and tc)"
    monkeypatch.setattr(netns_hosts.os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "")
    assert netns_hosts.unavailable_reason() == "needs `ip` (iproute2)"


@needs_netns
def test_the_command_line_builds_runs_and_removes(capsys: pytest.CaptureFixture[str]) -> None:
    assert netns_hosts.main(["up", "--hosts", "2", "--slow", "0-5:10"]) == 2
    assert "0..1" in capsys.readouterr().err
    assert netns_hosts.main(["up", "--hosts", "2", "--slow", "0-1:10"]) == 0
    prefix = json.loads(capsys.readouterr().out)["prefix"]
    try:
        assert len(_ours(prefix)) == 3
        assert netns_hosts.down() == []  # made by `up`: not an orphan
        assert netns_hosts.main(["run", "--prefix", prefix, "--host", "1", "--", "true"]) == 0
        assert netns_hosts.main(["run", "--prefix", prefix, "--host", "1", "--", "false"]) == 1
    finally:
        assert netns_hosts.main(["down", "--prefix", prefix]) == 0
    assert _ours(prefix) == []
