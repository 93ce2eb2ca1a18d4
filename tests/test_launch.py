"""common.launch.run_supervised_group: one failing rank takes the others down; a timeout kills all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from common.launch import RunFailed, child_env, group_running, is_loopback, run_supervised, run_supervised_group


def _py(code: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
    return [sys.executable, "-c", code], child_env({}), log


@pytest.mark.e2e
def test_first_failure_stops_the_others(tmp_path: Path):
    started = time.monotonic()
    ended = run_supervised_group([_py("import time; time.sleep(60)", tmp_path / "0.log"),
                                  _py("import sys; sys.exit(3)", tmp_path / "1.log")], timeout_s=30)
    assert ended.codes[1] == 3 and ended.codes[0] < 0  # the sleeper was killed by a signal
    assert ended.first_failed == 1  # not the one we killed afterwards
    assert time.monotonic() - started < 20


@pytest.mark.e2e
def test_all_succeed(tmp_path: Path):
    ended = run_supervised_group([_py("print('hi')", tmp_path / f"{i}.log") for i in range(2)], timeout_s=30)
    assert ended.codes == [0, 0] and ended.first_failed is None
    assert (tmp_path / "0.log").read_text().strip() == "hi"


def _live_processes_naming(marker: str) -> list[int]:
    """Pids whose command line holds `marker`, zombies left out (a killed orphan waits there for init)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace") and \
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone while read
    return found


def test_a_group_runs_until_its_last_process_is_dead_not_until_it_is_reaped():
    """_kill_group returns when group_running says so: a killed process the kernel has not stopped yet runs, a
    zombie (dead, not reaped: what a killed orphan is until init reaps it) does not."""
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_running(sleeper.pid) and not group_running(os.getpid() + 10**7)
        os.kill(sleeper.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not group_running(sleeper.pid)  # a zombie now: not reaped yet (no wait() below until here)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.e2e
def test_timeout_kills_every_rank(tmp_path: Path):
    """Each rank, and a process each rank started in its group (a launcher's worker), is gone afterwards."""
    marker = f"parbench-rank-{uuid.uuid4().hex}"
    rank = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
            "sys.argv[1] + '-worker']); time.sleep(60)")
    with pytest.raises(RunFailed, match="timed out"):
        run_supervised_group([([sys.executable, "-c", rank, marker], child_env({}), tmp_path / f"{i}.log")
                              for i in range(2)], timeout_s=1)
    assert _live_processes_naming(marker) == []


@pytest.mark.e2e
def test_a_health_check_ends_a_launcher_that_would_wait(tmp_path: Path):
    started = time.monotonic()
    with pytest.raises(RunFailed, match="rank 1 died"):
        run_supervised([sys.executable, "-c", "import time; time.sleep(60)"], child_env({}), tmp_path / "l.log",
                       timeout_s=30, health=lambda: "rank 1 died" if time.monotonic() - started > 1 else None)
    assert time.monotonic() - started < 20


@pytest.mark.e2e
def test_a_launcher_still_tearing_down_after_its_result_is_stopped_and_the_run_done(tmp_path: Path):
    """msrun's teardown after the workers' result took 7-9 s a run: given TEARDOWN_GRACE_S, it is stopped, its
    whole group with it, and the run counts as done; a launcher that ends on its own keeps its exit code."""
    result, pid_file = tmp_path / "result.json", tmp_path / "child.pid"
    code = (f"import pathlib, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)']); pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); "
            f"time.sleep(1); pathlib.Path({str(result)!r}).write_text('{{}}'); time.sleep(60)")
    started = time.monotonic()
    assert run_supervised([sys.executable, "-c", code], child_env({}), tmp_path / "l.log", timeout_s=30,
                          result=result, teardown_s=1.0) == 0
    assert time.monotonic() - started < 15
    assert "result.json was complete 1 s ago" in (tmp_path / "l.log").read_text()
    time.sleep(0.2)
    assert not Path(f"/proc/{pid_file.read_text()}").exists() or \
        Path(f"/proc/{pid_file.read_text()}/stat").read_text().split()[2] == "Z"
    # The ranks of a group likewise: rank 0 writes the result, both linger; none counts as failed.
    group_result = tmp_path / "group.json"
    linger = f"import pathlib, time; pathlib.Path({str(group_result)!r}).write_text('{{}}'); time.sleep(60)"
    started = time.monotonic()
    ended = run_supervised_group([_py(linger, tmp_path / "0.log"), _py("import time; time.sleep(60)", tmp_path /
                                                                       "1.log")], timeout_s=30, result=group_result,
                                 teardown_s=1.0)
    assert ended.first_failed is None and time.monotonic() - started < 15
    assert "were still tearing down: stopped" in (tmp_path / "0.log").read_text()
    # Without a result the launcher's own exit code stands, however long it takes.
    assert run_supervised([sys.executable, "-c", "import sys, time; time.sleep(2); sys.exit(5)"], child_env({}),
                          tmp_path / "m.log", timeout_s=30, result=tmp_path / "never.json", teardown_s=0.5) == 5


@pytest.mark.e2e
def test_children_run_this_interpreter_whatever_comes_first_on_path(foreign_python_path, monkeypatch):
    """msrun starts workers as a bare `python`: it must be the interpreter of the run."""
    monkeypatch.setenv("PATH", foreign_python_path)
    proc = subprocess.run(["python", "-c", "import sys; print(sys.prefix)"], env=child_env({}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == sys.prefix


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("10.0.0.1", False), ("0.0.0.0", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
