"""A real SLURM cluster on one machine, for tests: munged, slurmctld and two slurmd as Debian packages them
(slurm-wlm 22.05), each slurmd in its own network namespace (tests/netns.py), so that a job step on node B
sees only B's address and reaches node A over a real link, as on two machines.

Everything is private to the test session: a munged on its own socket, a slurm.conf of its own (SLURM_CONF),
namespaces `pbs<pid>a`/`pbs<pid>b` on a /24 of their own (10.232.N.0/24; tests/netns.py's two_hosts uses
10.231.N.0/30), state, spool and logs in a fresh folder wiped before and after. Daemons are stopped by their
pid files; whatever is left in a namespace is killed before the namespace is deleted (two_hosts). Every SLURM
client runs inside a namespace (Cluster.run): from the machine's own namespace the cluster's addresses are on no
interface, so that traffic would leave the machine by the default route.

Needs root, iproute2 and either the packages or apt-get to install them; `why_unavailable` says why not.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.netns import Host, two_hosts
from tests.netns import why_unavailable as why_no_namespaces

PACKAGES = ("slurm-wlm", "munge")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")
SUBNET = "10.232.{}"
NODES = ("nodeA", "nodeB")
PARTITION = "bench"
START_TIMEOUT_S = 60
# slurmctld's SIGTERM-to-SIGKILL grace for a cancelled or timed-out job; bench.run needs TERM_GRACE_S (10 s) and
# a little to stop its workers, so 20 s leaves room and keeps a broken clean-up inside the test's 30 s.
KILL_WAIT_S = 20


def install() -> str | None:
    """The packages through apt-get where they are missing (apt-get update first: a stale list names
    versions the mirror no longer has); why not, or None once every program is there."""
    if all(shutil.which(p) for p in PROGRAMS):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"SLURM is not installed and cannot be: installing {' '.join(PACKAGES)} needs root and apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode:
            return f"{' '.join(argv)} failed: {done.stderr.strip()[-300:]}"
    missing = [p for p in PROGRAMS if not shutil.which(p)]
    return f"installed {' '.join(PACKAGES)} but {', '.join(missing)} missing" if missing else None


def why_unavailable() -> str | None:
    return why_no_namespaces() or install()


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[Host, Host]
    root: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, argv: list[str], node: int = 0) -> list[str]:
        """`argv` inside node `node`'s namespace, with this cluster's configuration (through env)."""
        return self.hosts[node].command(argv)

    def run(self, *argv: str, node: int = 0, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(list(argv), node), capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def must(self, *argv: str, node: int = 0, timeout: float = 30) -> str:
        done = self.run(*argv, node=node, timeout=timeout)
        if done.returncode:
            raise OSError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()[-500:]}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self.must("sinfo", "--noheader", "--Node", "--format=%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline, states = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            with suppress(OSError, subprocess.TimeoutExpired):
                states = self.node_states()
                if all(states.get(n) == "idle" for n in NODES):
                    return
            time.sleep(0.5)
        raise OSError(f"nodes not idle within {timeout:.0f} s: {states}; logs in {self.root}: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        tails = []
        for log in sorted(self.root.glob("*.log")):
            tails.append(f"{log.name}: " + " | ".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "; ".join(tails)

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job slurmctld still knows, ("", "") once it has left the queue."""
        out = self.must("squeue", "--noheader", "--jobs", job_id, "--states=all", "--format=%T %r")
        return tuple(out.split(maxsplit=1)) if out.strip() else ("", "")  # type: ignore[return-value]


def _config(hosts: tuple[Host, Host], root: Path, munge_socket: Path) -> str:
    """slurm.conf: slurmctld checks that SlurmctldHost names its own host, so it is the machine's name at A's
    address; the nodes are named apart from the host and reached at their namespace's address."""
    cpus = os.cpu_count() or 1
    nodes = "\n".join(f"NodeName={name} NodeAddr={host.address} CPUs={cpus} State=UNKNOWN"
                      for name, host in zip(NODES, hosts))
    return f"""\
ClusterName=parbench
SlurmctldHost={socket.gethostname()}({hosts[0].address})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
KillWait={KILL_WAIT_S}
{nodes}
PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _start_daemon(host: Host, argv: list[str], pid_file: Path, env: dict) -> None:
    """A daemon that forks into the background and writes its pid file (how it is stopped)."""
    done = subprocess.run(host.command(argv), capture_output=True, text=True, env=env, timeout=START_TIMEOUT_S)
    if done.returncode:
        raise OSError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()[-500:]}")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not pid_file.is_file() or not pid_file.read_text().strip():
        if time.monotonic() > deadline:
            raise OSError(f"{argv[0]} wrote no pid file {pid_file}")
        time.sleep(0.1)


def _stop_daemons(pid_files: list[Path], timeout: float = 15) -> None:
    """SIGTERM to every daemon at once (each takes seconds to stop), SIGKILL to any left after `timeout`."""
    pids = []
    for pid_file in pid_files:
        with suppress(OSError, ValueError, IndexError):
            pids.append(int(pid_file.read_text().split()[0]))
            os.kill(pids[-1], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.1)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def slurm_cluster() -> Iterator[Cluster]:
    """munged, slurmctld and slurmd nodeA in namespace A, slurmd nodeB in namespace B; both nodes idle on entry.
    Raises OSError when a piece does not start, the daemons' log tails in it (tests.netns.or_unavailable)."""
    with two_hosts(prefix="pbs", subnet_prefix=SUBNET, prefix_len=24) as hosts:
        root = Path(tempfile.gettempdir()) / f"parbench-slurm-{os.getpid()}"
        shutil.rmtree(root, ignore_errors=True)
        (root / "state").mkdir(parents=True)
        (root / "spool").mkdir()
        key, munge_socket = root / "munge.key", root / "munge.socket"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        conf = root / "slurm.conf"
        conf.write_text(_config(hosts, root, munge_socket))
        # Without a cgroup.conf slurmd stops at "Unable to initialize cgroup plugin"; v1 is loaded but no cgroup
        # plugin is used (proctrack/linuxproc, task/none), and the machine's hierarchy is never remounted.
        (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        cluster = Cluster(hosts, root, conf)
        pid_files = [root / "munged.pid", root / "slurmctld.pid", *(root / f"slurmd-{n}.pid" for n in NODES)]
        try:
            try:
                _start_daemon(hosts[0], ["munged", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                                         f"--pid-file={pid_files[0]}", f"--log-file={root / 'munged.log'}",
                                         f"--seed-file={root / 'munged.seed'}"], pid_files[0], cluster.env)
                _start_daemon(hosts[0], ["slurmctld", "-f", str(conf)], pid_files[1], cluster.env)
                for (name, host), pid_file in zip(zip(NODES, hosts), pid_files[2:]):
                    _start_daemon(host, ["slurmd", "-f", str(conf), "-N", name], pid_file, cluster.env)
            except OSError as exc:  # the logs go with the folder on the way out: their tails go in the error
                raise OSError(f"{exc}; daemons' log tails: {cluster.log_tail() or '(no log written)'}") from exc
            cluster.wait_idle()  # its error has the tails
            yield cluster
        finally:
            _stop_daemons(pid_files)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # by hand: bring the cluster up, print how to use it, keep it until Enter
    reason = why_unavailable()
    if reason:
        sys.exit(reason)
    with slurm_cluster() as c:
        print(f"SLURM_CONF={c.conf} ip netns exec {c.hosts[0].netns} sinfo; nodes {c.node_states()}")
        input("Enter stops the cluster ")
