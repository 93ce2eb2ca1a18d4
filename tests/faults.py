"""Helpers for fault tests: start bench.run in the background, find a rank's worker in /proc, kill it
from outside, and list what a run leaves running or listening."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import REPO


def start_run(out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """bench.run in a session of its own, its output in OUT/bench.log."""
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "bench.log", "wb")  # noqa: SIM115 (the child owns it; closed with the test's tmp dir)
    return subprocess.Popen([sys.executable, "-m", "bench.run", *args, "--out", str(out)], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def run_processes(out: Path) -> list[int]:
    """Every live process (not a zombie) whose command line names the run's output folder: bench.run,
    the launcher and every worker carry it, through the config path."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(out).encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def torch_rank(env: dict[str, str]) -> int | None:
    return int(env["RANK"]) if "TORCHELASTIC_RUN_ID" in env and "RANK" in env else None


def tf_rank(env: dict[str, str]) -> int | None:
    return int(json.loads(env["TF_CONFIG"])["task"]["index"]) if "TF_CONFIG" in env else None


def mindspore_rank(env: dict[str, str]) -> int | None:
    return int(env["RANK_ID"]) if env.get("MS_ROLE") == "MS_WORKER" else None


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"bench.run ended (code {proc.returncode}) before {what}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout_s:g} s")


def worker_pid(out: Path, rank: int, rank_of: Callable[[dict], int | None]) -> int | None:
    for pid in run_processes(out):
        if rank_of(environ(pid)) == rank:
            return pid
    return None


def training_started(checkpoint_dir: Path) -> bool:
    """A first checkpoint is written: every rank is past start-up and inside the training loop."""
    return checkpoint_dir.is_dir() and any(not p.name.startswith(".") for p in checkpoint_dir.iterdir())


def kill_and_time(proc: subprocess.Popen, out: Path, pid: int, end_timeout_s: float = 120) -> tuple[float, dict]:
    """SIGKILL `pid` from outside; return (seconds from the kill until bench.run has exited, its record)."""
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=end_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"bench.run still running {end_timeout_s:g} s after pid {pid} was killed") from None
    elapsed = time.monotonic() - killed_at
    [record] = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    return elapsed, record


def listening_sockets(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by one of `pids`."""
    inodes = set()
    for pid in pids:
        inodes |= {link[len("socket:["):-1] for link in _fd_links(pid) if link.startswith("socket:[")}
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                address, port = fields[1].split(":")
                found.append((_address(address, family), int(port, 16)))
    return found


def _fd_links(pid: int) -> list[str]:
    """What each open descriptor of pid points at; one that closes while read (the listing's own, in this
    process) is left out, not the whole process."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []
    links = []
    for fd in fds:
        try:
            links.append(str(fd.readlink()))
        except OSError:
            continue
    return links


def _address(hex_address: str, family: int) -> str:
    """/proc/net/tcp writes an address as host-order 32-bit words in hex."""
    words = [int(hex_address[i:i + 8], 16) for i in range(0, len(hex_address), 8)]
    return socket.inet_ntop(family, b"".join(struct.pack("=I", w) for w in words))


def tf_grpc_ports(out: Path) -> set[int]:
    """The ports of the run's TF_CONFIG cluster, as a worker sees it."""
    for pid in run_processes(out):
        env = environ(pid)
        if "TF_CONFIG" in env:
            return {int(a.rpartition(":")[2]) for a in json.loads(env["TF_CONFIG"])["cluster"]["worker"]}
    return set()
