"""Starting launcher processes (torchrun, msrun, TF workers) so that none outlives its run."""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common.config import RunConfig
from common.errors import EXIT_UNSUPPORTED, Cancelled, Unsupported
from common.hostinfo import REPO_ROOT

TERM_GRACE_S = 10.0
GROUP_GONE_S = 2.0  # the longest _kill_group waits for a SIGKILLed group to stop running
# A single-host run talks to itself only: every rendezvous, store and collective listens here.
LOOPBACK = "127.0.0.1"
# Ports handed out by free_port, one file per port naming the process that holds it (see _lease).
PORT_LEASE_DIR = Path(tempfile.gettempdir()) / "parbench-ports"
_my_leases: list[Path] = []
# Beside a run's config: why a worker refused a configuration it could only find out about by trying
# (common.worker writes it and exits EXIT_UNSUPPORTED).
UNSUPPORTED_FILE = "unsupported.txt"


class RunFailed(Exception):
    """The run started but did not finish; the message is the record's `error`."""


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def free_port(host: str = LOOPBACK) -> int:
    """A port free right now on `host`, chosen by the kernel (never a fixed number), and leased to
    this process until it exits: the launcher binds it seconds later, and in between a second
    parbench run on this machine (two sweeps at once) must not be handed the same port."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if _lease(port):
            return port
    raise RunFailed("no free port: 100 picks in a row were leased to other parbench runs")


def _lease(port: int) -> bool:
    """Claim `port` for this process with an exclusively created file; a lease whose holder is dead
    is taken over. False when a live process holds it."""
    PORT_LEASE_DIR.mkdir(mode=0o1777, parents=True, exist_ok=True)
    path = PORT_LEASE_DIR / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _holder_alive(path):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        if not _my_leases:
            atexit.register(_release_leases)
        _my_leases.append(path)
        return True
    return False


def _holder_alive(path: Path) -> bool:
    try:
        text = path.read_text()
        if not text:  # being written right now by its creator, unless it died doing so
            return time.time() - path.stat().st_mtime < 10
        pid = int(text)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release_leases() -> None:
    for path in _my_leases:
        with contextlib.suppress(OSError):
            if path.read_text() == str(os.getpid()):
                path.unlink()


def cancel_on_signals() -> None:
    """SIGINT and SIGTERM raise Cancelled in the main thread, once: whatever runs unwinds and stops the
    processes it started (run_supervised kills its group on any exit). A second signal during that
    clean-up is ignored, so that it cannot cut the clean-up short and leave orphans."""
    def cancel(signum, frame):
        if not cancel.raised:
            cancel.raised = True
            raise Cancelled(signum)
    cancel.raised = False
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, cancel)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment plus the repo on PYTHONPATH, so workers import common/ and backends/,
    and this interpreter's folder first on PATH: msrun starts its workers as a bare `python` from PATH
    (mindspore.parallel.cluster.process_entity._utils), which must be the interpreter of the run, not
    whatever comes first when the suite was started as `/path/to/venv/bin/python -m bench...`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p)
    env.update(extra)
    return env


# What a launcher is given to tear down after its workers' result is complete (run_supervised's `result`): the
# result is written atomically and last, so what follows is only the launchers' own exit (measured on 2 cores:
# torchrun 1.9 s, msrun 8 s on its 5 s poll). Stopped at 0.5 s, a CPU run of torch_ddp ends 0.7 s sooner and
# one of mindspore_auto 1.7 s sooner than at 2 s.
TEARDOWN_GRACE_S = 0.5


def _kill_group(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left after `grace_s` (0: SIGKILL at once)."""
    steps = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)) if grace_s > 0 else ((signal.SIGKILL, 5.0),)
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # The leader is gone; its workers may linger in the group.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
    # A signal is delivered when its process next runs: on a loaded host a killed worker can run on for a moment
    # after killpg returns. Return when none of the group runs any more.
    deadline = time.monotonic() + GROUP_GONE_S
    while group_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs: a zombie (dead, waiting for a parent or init to reap it) does
    not. Where there is no /proc (not Linux), False."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone while read
        if int(group) == pgid and state != "Z":
            return True
    return False


def run_supervised(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float,
                   health: Callable[[], str | None] | None = None, poll_s: float = 0.5,
                   result: Path | None = None, teardown_s: float = TEARDOWN_GRACE_S) -> int:
    """Run `cmd` in its own process group with output to `log_path`; kill the group on timeout or
    interrupt. `health`, polled while the launcher runs, returns why the run is already lost (a
    worker died that the launcher would wait out) or None. `result`: the file the workers write last
    (atomically), for a launcher whose teardown after it can take longer than the run's own work
    (msrun: its scheduler finalizes on a 5 s poll): `teardown_s` after that file appears, the group is
    stopped and the run counts as done (0), with a line in the log saying so. Returns the exit code;
    raises RunFailed on timeout or when `health` reports."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        started, finished = time.monotonic(), None
        try:
            while (rc := proc.poll()) is None:
                if time.monotonic() - started > timeout_s:
                    raise RunFailed(f"timed out after {time.monotonic() - started:.0f} s (--timeout {timeout_s:g}); "
                                    f"log tail: {log_tail(log_path)}")
                if finished is None and result is not None and result.is_file():
                    finished = time.monotonic()
                if finished is not None and time.monotonic() - finished > teardown_s:
                    log.write(f"\nparbench: {result.name} was complete {teardown_s:g} s ago and the launcher was "
                              "still tearing down: stopped\n".encode())
                    log.flush()
                    _kill_group(proc)  # SIGTERM first: torchrun forwards it to its workers, in sessions of their own
                    return 0
                lost = health() if health else None
                if lost:
                    raise RunFailed(lost)
                time.sleep(poll_s)
        except BaseException:
            _kill_group(proc)
            raise
    # Workers of a launcher that exited on its own may still be winding down.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return rc


def log_tail(path: Path, lines: int = 15, max_chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail)[-max_chars:]


@dataclass
class GroupExit:
    codes: list[int]          # exit codes in order (negative: killed by a signal, maybe by us)
    first_failed: int | None  # the index that failed first, seen before the others were stopped


def run_supervised_group(commands: list[tuple[list[str], dict[str, str], Path]], timeout_s: float,
                         poll_s: float = 0.2, result: Path | None = None,
                         teardown_s: float = TEARDOWN_GRACE_S) -> GroupExit:
    """Run cooperating processes (the ranks of one job), each `(cmd, env, log_path)` in its own process
    group. The first to fail takes the others down at once: a peer blocked in a collective with a dead
    rank would otherwise sit out its collective timeout. `result` and `teardown_s` as run_supervised's: the
    ranks still tearing down `teardown_s` after the result is complete are stopped, and none counts as
    failed. Raises RunFailed on timeout; every group is killed on any exit from here."""
    procs: list[subprocess.Popen] = []
    first_failed, finished, cut = None, None, False
    with contextlib.ExitStack() as logs:
        try:
            for cmd, env, log_path in commands:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = logs.enter_context(open(log_path, "ab"))
                procs.append(subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True))
            deadline = time.monotonic() + timeout_s
            while True:
                codes = [p.poll() for p in procs]
                failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    first_failed = failed[0]
                    break
                if all(c is not None for c in codes):
                    break
                if finished is None and result is not None and result.is_file():
                    finished = time.monotonic()
                if finished is not None and time.monotonic() - finished > teardown_s:
                    cut = True
                    with open(commands[0][2], "ab") as log:
                        log.write(f"\nparbench: {result.name} was complete {teardown_s:g} s ago and ranks "
                                  f"{[i for i, c in enumerate(codes) if c is None]} were still tearing down: "
                                  "stopped\n".encode())
                    break
                if time.monotonic() > deadline:
                    raise RunFailed(f"timed out after {timeout_s:g} s (--timeout); log tail of rank 0: "
                                    f"{log_tail(commands[0][2])}")
                time.sleep(poll_s)
        finally:
            # The peers of a failed rank are stuck in collectives that cannot complete: nothing to wind
            # down (a TF worker took 5 s to act on SIGTERM), so they are killed outright.
            for proc in procs:
                _kill_group(proc, 0 if first_failed is not None or cut else TERM_GRACE_S)
    return GroupExit([p.returncode for p in procs], first_failed)


class Launcher(Protocol):
    """How a backend starts its workers: a launcher (torchrun, msrun), a group of processes, or one."""

    def start(self, worker: list[str]) -> int:
        """Run `worker` (its entry point and arguments, without the interpreter, ending with CONFIG RESULT) to its
        end; the exit code. A teardown still running TEARDOWN_GRACE_S after RESULT is complete is stopped (the
        run is done: run_supervised's `result`). Raises RunFailed when the run is lost before that (timeout, a
        dead worker the launcher would wait out)."""

    def failure(self, code: int) -> str:
        """Why the run failed (exit `code`, or no result), from what the launcher and its workers left."""


def launch(cfg: RunConfig, workdir: Path, entry: list[str], launcher: Launcher, result_name: str = "result.json",
           read: Callable[[Path], dict] | None = None) -> dict:
    """The one way every backend runs: the config beside the workers, `entry CONFIG RESULT` under
    `launcher`, then the result (Unsupported when a worker refused by trying, RunFailed without a result).
    `read` turns RESULT into the outcome where the workers leave it otherwise (raising RunFailed)."""
    config_path, result_path = workdir / "config.json", workdir / result_name
    cfg.save(config_path)
    code = launcher.start([*entry, str(config_path), str(result_path)])
    refused = workdir / UNSUPPORTED_FILE
    if code == EXIT_UNSUPPORTED and refused.is_file():
        raise Unsupported(refused.read_text().strip())
    if code != 0 or (read is None and not result_path.is_file()):
        raise RunFailed(launcher.failure(code))
    return read(result_path) if read else json.loads(result_path.read_text())


@dataclass
class OneProcess:
    """The worker as one child of this interpreter: it drives every device of the run itself."""
    env: dict[str, str]
    log: Path
    timeout_s: float
    what: str = "worker"

    def start(self, worker: list[str]) -> int:
        return run_supervised([sys.executable, *worker], child_env(self.env), self.log, self.timeout_s,
                              result=Path(worker[-1]))

    def failure(self, code: int) -> str:
        return f"{self.what} exited with code {code}: {log_tail(self.log)}"


@dataclass
class ProcessGroup:
    """One child per device of this node, ranks first_rank onwards, each with its own environment and log;
    the first to fail takes the others down (run_supervised_group)."""
    envs: list[dict[str, str]]
    logs: list[Path]
    first_rank: int
    timeout_s: float
    ended: GroupExit | None = field(default=None, init=False)

    def start(self, worker: list[str]) -> int:
        commands = [([sys.executable, *worker], child_env(env), log) for env, log in zip(self.envs, self.logs)]
        self.ended = run_supervised_group(commands, self.timeout_s, result=Path(worker[-1]))
        failed = self.ended.first_failed
        return 0 if failed is None else self.ended.codes[failed]

    def failure(self, code: int) -> str:
        failed = self.ended.first_failed if self.ended else None
        if failed is None:
            return f"workers exited without a result: {log_tail(self.logs[0])}"
        rank, code = self.first_rank + failed, self.ended.codes[failed]
        signal_note = f" (signal {-code})" if code < 0 else ""
        return (f"worker {rank} (rank {rank}) exited with code {code}{signal_note} first "
                f"(this node's: {self.ended.codes}): {log_tail(self.logs[failed])}")
