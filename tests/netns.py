"""Two "hosts" on one machine: two network namespaces joined by a veth pair, made and removed by the
test itself. Each namespace has its own interfaces, addresses and ports, so a run across them
crosses a real network link (no loopback shortcut), as a run across two machines would.

Needs root and iproute2; `why_unavailable` says why not otherwise, for the skip message (or the error, where
$PARBENCH_REQUIRE_CLUSTER asks for the cluster: see or_unavailable).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

# A /30 inside the namespaces only: they have no other routes, so it cannot clash with the host's.
# Another user of two_hosts (tests/slurm_cluster.py) passes a subnet of its own, so that both may run at once.
SUBNET_PREFIX = "10.231.{}"
CHECK_TIMEOUT_S = 20
NETNS_ETC = Path("/etc/netns")  # per-namespace /etc files that `ip netns exec` mounts in place
# Set (to anything but 0) where the cluster tests must run: a missing capability or a failed start is then an
# error, not a skip (.ci/run sets it).
REQUIRE_CLUSTER_ENV = "PARBENCH_REQUIRE_CLUSTER"


def why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


@dataclass(frozen=True)
class Host:
    netns: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (ip netns exec execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.netns, *argv]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _kill_namespace_processes(netns: str) -> None:
    """Anything a test left running in its namespace (only the test starts processes there)."""
    done = _ip("netns", "pids", netns)
    for pid in (int(p) for p in done.stdout.split() if p.isdigit()):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _check_link(a: Host, b: Host) -> None:
    """A TCP connection from b to a listener in a, with Python (there is no ping here)."""
    listen = (f"import socket; s = socket.create_server(('{a.address}', 0)); print(s.getsockname()[1], flush=True); "
              f"s.settimeout({CHECK_TIMEOUT_S}); s.accept()")
    server = subprocess.Popen(a.command([sys.executable, "-c", listen]), stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        client = subprocess.run(b.command([sys.executable, "-c",
                                           f"import socket; socket.create_connection(('{a.address}', {port}), "
                                           f"timeout={CHECK_TIMEOUT_S})"]),
                                capture_output=True, text=True, timeout=CHECK_TIMEOUT_S + 10)
        if client.returncode:
            raise OSError(f"{b.address} cannot reach {a.address}:{port}: {client.stderr.strip()[-300:]}")
    finally:
        server.kill()
        server.wait()


def _name_resolves_to(host: Host) -> None:
    """Inside the namespace, this machine's host name resolves to the namespace's own address, as a cluster
    node's name resolves to its address: programs that find their address from their host name (JAX's gloo
    collectives) then bind there and not to loopback. `ip netns exec` mounts /etc/netns/NAME/hosts over
    /etc/hosts for what it runs (ip-netns(8))."""
    folder = NETNS_ETC / host.netns
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {socket.gethostname()}\n")


@contextmanager
def or_unavailable(why_unavailable: Callable[[], str | None], make: Callable[[], AbstractContextManager], what: str):
    """For a fixture: what `make` makes, or why not (what `why_unavailable` says, or the OSError `make` raised on
    the way in, which carries the daemons' log tails; a failing test raises its own error, never into the
    fixture). Why not is a skip, its reason in pytest's summary (-ra), on a developer's machine without root;
    where $PARBENCH_REQUIRE_CLUSTER is set (CI, .ci/run), it is an error: a cluster test must not pass as a skip."""
    reason = why_unavailable()
    if reason:
        _unavailable(reason)
    failure = None
    try:
        with make() as made:
            yield made
    except OSError as exc:
        failure = f"{what}: {exc}"
    if failure:  # outside the except: the report is the reason, not a chain of tracebacks
        _unavailable(failure)


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_CLUSTER_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_CLUSTER_ENV} is set and the cluster cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@contextmanager
def two_hosts(prefix: str = "pb", subnet_prefix: str = SUBNET_PREFIX,
              prefix_len: int = 30) -> Iterator[tuple[Host, Host]]:
    """Namespaces `pb<pid>a`/`pb<pid>b`, veth `pb<pid>x`/`pb<pid>y`, 10.231.N.1/30 and .2/30, lo up in
    both (`prefix`, `subnet_prefix` and `prefix_len` change the names and the subnet). Everything is
    deleted on the way out, also when the test fails. Raises OSError when the kernel refuses (or_unavailable
    says why)."""
    tag = f"{prefix}{os.getpid() % 10**8}"
    names, links = (f"{tag}a", f"{tag}b"), (f"{tag}x", f"{tag}y")
    subnet = subnet_prefix.format(os.getpid() % 250)
    hosts = (Host(names[0], f"{subnet}.1"), Host(names[1], f"{subnet}.2"))
    try:
        for host in hosts:
            _must("netns", "add", host.netns)
            _name_resolves_to(host)
        _must("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for host, link in zip(hosts, links):
            _must("link", "set", link, "netns", host.netns)
            _must("-n", host.netns, "addr", "add", f"{host.address}/{prefix_len}", "dev", link)
            _must("-n", host.netns, "link", "set", link, "up")
            _must("-n", host.netns, "link", "set", "lo", "up")
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while True:  # the veth carrier may take a moment to come up
            try:
                _check_link(*hosts)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield hosts
    finally:
        for host in hosts:
            _kill_namespace_processes(host.netns)
            _ip("netns", "del", host.netns)  # takes its end of the veth pair, and so the pair, with it
            shutil.rmtree(NETNS_ETC / host.netns, ignore_errors=True)
        _ip("link", "del", links[0])  # only there if setup failed before moving it
