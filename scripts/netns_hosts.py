"""Test hosts with uneven links: several network namespaces on this machine, each a "host" with
one address, joined through a bridge, with chosen host pairs slowed by rate.

Layout (all of it inside namespaces, so the machine's own network is never touched and parallel
runs cannot collide even on the same subnet)::

    <prefix>-h0  eth0 10.213.0.1/24 ──veth── p0 ┐
    <prefix>-h1  eth0 10.213.0.2/24 ──veth── p1 ├─ br0 in <prefix>-sw
    <prefix>-h2  eth0 10.213.0.3/24 ──veth── p2 ┘

Shaping is per destination: each host's eth0 egress has an htb root; for every slow pair (i, j)
host i has a class at that rate with a u32 filter on j's address, and host j one on i's, so both
directions of that pair are slow and every other pair is not. Unclassified traffic goes to htb's
direct queue (unshaped), or to a default class when ``default_rate_mbit`` is given. This kernel
has no netem, so a slow link is slow by rate, not by added delay.

Every process started through ``popen``/``run`` gets its own UTS namespace with the host's name
as hostname (so ``socket.gethostname()`` tells the hosts apart, as the profiler needs),
``GLOO_SOCKET_IFNAME=eth0`` (so gloo binds the host's address), and the host's share of this
machine's cores as its CPU affinity (``host_cores``), which a rank sizes its threads by, as on a
real host. Unpinned, each host's rank took every core of the machine for its threads: 4 hosts
ran 8 threads on 2 cores, and a tp2 dp2 step of tiny-gpt took 2.2-2.7 s against 0.24 s for the
same plan as 4 ranks of one host.

Teardown deletes the namespaces (which removes their veths and the bridge) and stops the
processes started here; it runs on leaving the context, at interpreter exit, and on SIGINT or
SIGTERM. ``down`` removes leftovers: every namespace of a given prefix, or, without one, those
whose owning process is gone.

Needs root, iproute2 (``ip``, ``tc``) and util-linux ``unshare``; ``unavailable_reason()`` says
what is missing. Standard library only.

CLI::

    python scripts/netns_hosts.py up --hosts 3 --slow 0-1:50      # prints the prefix and addresses
    python scripts/netns_hosts.py run --prefix P --host 1 -- python -c 'import socket; print(socket.gethostname())'
    python scripts/netns_hosts.py down --prefix P                  # or no --prefix: orphaned runs
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

SUBNET = "10.213.0"
"""Host i has SUBNET.(i + 1)/24; private, and only ever configured inside our namespaces."""
PREFIX_FAMILY = "nh"
INTERFACE = "eth0"
"""The host side of each veth, inside the host's namespace."""
MAX_HOSTS = 250
STOP_GRACE_S = 3.0
"""Seconds our processes get between SIGTERM and SIGKILL at teardown."""
_PREFIX_RE = re.compile(rf"^{PREFIX_FAMILY}(\d+)x[0-9a-f]{{4}}-")
_DETACHED_PID = 0
"""Owner pid in the prefix of namespaces made by ``up``: removed only by an explicit prefix."""


def address(host: int) -> str:
    """The IPv4 address of host ``host`` (0-based)."""
    return f"{SUBNET}.{host + 1}"


def new_prefix(owner_pid: int | None = None) -> str:
    """A name prefix unique to this invocation: the owner's pid (to reap orphans) and random hex."""
    pid = os.getpid() if owner_pid is None else owner_pid
    return f"{PREFIX_FAMILY}{pid}x{secrets.token_hex(2)}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _tc(namespace: str, *args: str) -> None:
    subprocess.run(["tc", "-n", namespace, *args], check=True, capture_output=True, text=True)


def list_namespaces() -> list[str]:
    """Names of every network namespace ``ip netns`` knows."""
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def down(prefix: str | None = None) -> list[str]:
    """Delete leftover namespaces: those named ``<prefix>-…``, or without a prefix, those of
    our family whose owning process is gone (never a live run's, never a detached ``up``'s).

    Returns:
        The names deleted.
    """
    doomed = []
    for name in list_namespaces():
        if prefix is not None:
            if name.startswith(prefix + "-"):
                doomed.append(name)
            continue
        match = _PREFIX_RE.match(name)
        if match and int(match.group(1)) != _DETACHED_PID and not _pid_alive(int(match.group(1))):
            doomed.append(name)
    for name in doomed:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", name)
    return doomed


def unavailable_reason() -> str | None:
    """Why namespaced hosts cannot be built here (not root, a tool missing, netns refused), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces, veths and tc)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"needs `{tool}` ({package})"
    probe = f"{new_prefix()}-probe"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` failed: {e.stderr.strip()}"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", probe)
    return None


def _pair(link: tuple[int, int], n_hosts: int) -> tuple[int, int]:
    i, j = link
    if i == j or not (0 <= i < n_hosts and 0 <= j < n_hosts):
        raise ValueError(f"slow link {link} must join two different hosts among 0..{n_hosts - 1}")
    return (min(i, j), max(i, j))


@dataclass(frozen=True, slots=True)
class Host:
    """One namespaced host."""

    index: int
    namespace: str
    address: str
    hostname: str
    """The hostname processes started on this host see (their own UTS namespace)."""


class NetnsHosts:
    """``n_hosts`` namespaced hosts on one bridge, with the pairs in ``slow_links`` limited to
    their rate in Mbit/s (both directions) and the others limited to ``default_rate_mbit``
    (unlimited when None). A context manager: entering builds, leaving tears down."""

    def __init__(
        self,
        n_hosts: int,
        slow_links: Mapping[tuple[int, int], float] | None = None,
        default_rate_mbit: float | None = None,
        *,
        prefix: str | None = None,
        detached: bool = False,
    ) -> None:
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts={n_hosts} must be between 1 and {MAX_HOSTS}")
        rates: dict[tuple[int, int], float] = {}
        for link, rate in (slow_links or {}).items():
            pair = _pair(link, n_hosts)
            if rate <= 0 or rates.get(pair, rate) != rate:
                raise ValueError(f"slow link {link}: rate {rate} Mbit/s must be positive and given once per pair")
            rates[pair] = rate
        if default_rate_mbit is not None and default_rate_mbit <= 0:
            raise ValueError(f"default_rate_mbit={default_rate_mbit} must be positive (or None: unlimited)")
        self.n_hosts = n_hosts
        self.slow_links = rates
        self.default_rate_mbit = default_rate_mbit
        self.prefix = prefix or new_prefix(_DETACHED_PID if detached else None)
        self.switch = f"{self.prefix}-sw"
        self.hosts = [
            Host(index=i, namespace=f"{self.prefix}-h{i}", address=address(i), hostname=f"{self.prefix}-h{i}")
            for i in range(n_hosts)
        ]
        self._made: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._old_handlers: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- building ---------------------------------------------------------------------------
    def __enter__(self) -> NetnsHosts:
        self.up()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def up(self) -> None:
        """Build the namespaces, bridge, veths, addresses and shaping; tear down what was made if
        any step fails, and arm teardown at exit and on SIGINT/SIGTERM."""
        atexit.register(self.close)
        self._arm_signals()
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_host(host)
            for host in self.hosts:
                self._shape(host)
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _add_host(self, host: Host) -> None:
        port = f"p{host.index}"
        self._add_namespace(host.namespace)
        _ip(
            "link",
            "add",
            INTERFACE,
            "netns",
            host.namespace,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            self.switch,
        )
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", INTERFACE)
        _ip("-n", host.namespace, "link", "set", INTERFACE, "up")

    def peer_rates_mbit(self, host: int) -> dict[int, float]:
        """The slowed peers of ``host`` and their rate (Mbit/s)."""
        return {b if a == host else a: r for (a, b), r in self.slow_links.items() if host in (a, b)}

    def _shape(self, host: Host) -> None:
        peers = self.peer_rates_mbit(host.index)
        if not peers and self.default_rate_mbit is None:
            return
        ns = host.namespace
        # Minor 0 as the default sends unclassified packets to htb's direct queue: unshaped.
        default = "1" if self.default_rate_mbit is not None else "0"
        _tc(ns, *f"qdisc add dev {INTERFACE} root handle 1: htb default {default}".split())
        if self.default_rate_mbit is not None:
            rate = f"{self.default_rate_mbit}mbit"
            _tc(ns, *f"class add dev {INTERFACE} parent 1: classid 1:1 htb rate {rate} ceil {rate}".split())
        for peer, mbit in sorted(peers.items()):
            classid, rate = f"1:{100 + peer:x}", f"{mbit}mbit"
            _tc(ns, *f"class add dev {INTERFACE} parent 1: classid {classid} htb rate {rate} ceil {rate}".split())
            match = f"u32 match ip dst {address(peer)}/32 flowid {classid}"
            _tc(ns, *f"filter add dev {INTERFACE} parent 1: protocol ip prio 1 {match}".split())

    # -- running ----------------------------------------------------------------------------
    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host``, with the host's hostname."""
        h = self.hosts[host]
        return command_in(h.namespace, h.hostname, argv)

    def host_cores(self, host: int) -> set[int]:
        """The cores of this machine ``host`` runs on: the usable cores split evenly among the hosts,
        or, with more hosts than cores, one core each, hosts taking the cores in turn."""
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        share = len(cores) // self.n_hosts
        if share == 0:
            return {cores[host % len(cores)]}
        return set(cores[host * share : (host + 1) * share])

    def popen(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
        """Start ``argv`` on ``host`` (a ``subprocess.Popen`` in a new session; at teardown, its process
        group is stopped: SIGTERM, then SIGKILL after ``STOP_GRACE_S``).
        ``env`` is added to this process's environment, after ``GLOO_SOCKET_IFNAME``."""
        full_env = {**os.environ, "GLOO_SOCKET_IFNAME": INTERFACE, **(env or {})}
        # A session of its own: teardown stops the whole group (torchrun's workers too), and a
        # terminal's Ctrl-C reaches only this process, whose handler tears down.
        kwargs.setdefault("start_new_session", True)
        cores = self.host_cores(host)
        if hasattr(os, "sched_setaffinity"):
            kwargs.setdefault("preexec_fn", lambda: os.sched_setaffinity(0, cores))
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(host, argv), env=full_env, **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None, *, timeout_s: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` to completion; its output captured as text."""
        proc = self.popen(host, argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # -- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop our processes still running and delete our namespaces. Idempotent."""
        with self._lock:
            _stop_groups(self._procs)
            self._procs.clear()
            for name in reversed(self._made):
                with contextlib.suppress(subprocess.CalledProcessError):
                    _ip("netns", "del", name)
            self._made.clear()
            self._disarm_signals()
            atexit.unregister(self.close)

    def detach(self) -> None:
        """Leave the namespaces up after this process exits (``up`` on the command line)."""
        with self._lock:
            self._made.clear()
            self._disarm_signals()
            atexit.unregister(self.close)

    def _arm_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; atexit and __exit__ still clean up
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)

    def _disarm_signals(self) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._old_handlers.get(signum, signal.SIG_DFL)
        self.close()  # restores the previous handlers
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)


def _stop_groups(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGTERM the process group each of ``procs`` leads (a launcher forwards it to its workers),
    then SIGKILL what is left after ``STOP_GRACE_S``."""
    groups = [p.pid for p in procs if p.poll() is None or _group_alive(p.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            for proc in procs:
                proc.poll()  # reap a leader that ended: a zombie would keep its group "alive"
            if not any(_group_alive(g) for g in groups):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def command_in(namespace: str, hostname: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run in ``namespace`` with its own UTS namespace named ``hostname``."""
    setup = 'hostname "$1" && shift && exec "$@"'
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "--", "sh", "-c", setup, "sh", hostname, *argv]


# -- command line -------------------------------------------------------------------------------
def _slow_arg(text: str) -> tuple[tuple[int, int], float]:
    match = re.fullmatch(r"(\d+)-(\d+):([0-9.]+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"--slow {text!r}: write I-J:MBIT, e.g. 0-1:50")
    return (int(match.group(1)), int(match.group(2))), float(match.group(3))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build hosts and leave them up; prints the prefix and addresses as JSON")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--slow", type=_slow_arg, action="append", default=[], help="I-J:MBIT, repeatable")
    up.add_argument("--default-rate", type=float, default=None, help="Mbit/s of every other pair (default unlimited)")
    dn = sub.add_parser("down", help="delete leftovers: a prefix's namespaces, or orphaned runs'")
    dn.add_argument("--prefix", default=None)
    run = sub.add_parser("run", help="run a command on one host of a prefix made by `up`")
    run.add_argument("--prefix", required=True)
    run.add_argument("--host", type=int, required=True)
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.action != "down" and (reason := unavailable_reason()):
        print(f"netns_hosts: {reason}", file=sys.stderr)
        return 2
    if args.action == "up":
        try:
            hosts = NetnsHosts(args.hosts, dict(args.slow), args.default_rate, detached=True)
        except ValueError as e:
            print(f"netns_hosts: {e}", file=sys.stderr)
            return 2
        hosts.up()
        hosts.detach()
        record = {
            "prefix": hosts.prefix,
            "hosts": [{"namespace": h.namespace, "address": h.address} for h in hosts.hosts],
        }
        print(json.dumps(record))
        return 0
    if args.action == "down":
        for name in down(args.prefix):
            print(f"deleted {name}")
        return 0
    namespace = f"{args.prefix}-h{args.host}"
    if namespace not in list_namespaces():
        print(f"netns_hosts: no namespace {namespace}; build hosts with `up` first", file=sys.stderr)
        return 2
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    env = {**os.environ, "GLOO_SOCKET_IFNAME": INTERFACE}
    return subprocess.run(command_in(namespace, namespace, command), env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
