"""common.launch.run_supervised_group: one failing rank takes the others down; a timeout kills all."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from common.launch import RunFailed, child_env, is_loopback, run_supervised, run_supervised_group


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
