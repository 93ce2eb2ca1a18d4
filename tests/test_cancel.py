"""Ctrl-C and SIGTERM on bench.compare and bench.run: every process of the run stops within seconds, no
record claims success, one line says what was cancelled, and the exit status is 128 + the signal."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here starts processes

MARK = "PARBENCH_TEST_CANCEL_MARK"
WORKER = "backends.torch_ddp.worker"


def _marked(mark: str) -> list[tuple[int, str]]:
    """Every live process that inherited this test's mark: the harness, torchrun and the workers, in
    whatever session or process group they put themselves."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":  # a zombie holds nothing; its parent reaps it
                continue
            found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError):
            continue
    return found


def _workers(mark: str) -> list[int]:
    return [pid for pid, cmd in _marked(mark) if WORKER in cmd and "torchrun" not in cmd]


@pytest.mark.parametrize("module, sig", [("bench.compare", signal.SIGINT), ("bench.compare", signal.SIGTERM),
                                         ("bench.run", signal.SIGINT)])
def test_a_signal_stops_every_process_and_writes_no_ok_record(tmp_path, module, sig):
    mark = secrets.token_hex(8)
    devices = ["--gpus", "2", "--backends", "torch_ddp", "--workloads", "cnn"] if module == "bench.compare" else \
        ["--devices", "2", "--backend", "torch_ddp", "--workload", "cnn"]
    cmd = [sys.executable, "-m", module, *devices, "--data", "synthetic", "--steps", "100000", "--batch-size", "4",
           "--threads-per-device", "1", "--device-kind", "cpu", "--out", str(tmp_path)]
    # A process group of its own, signalled as a whole: what a terminal does on Ctrl-C.
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, MARK: mark}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_workers(mark)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(2)  # the workers are in their training loop, not starting up
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    time.sleep(1)  # the last SIGKILLed stragglers leave /proc
    assert _marked(mark) == []
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "cancelled" in ln]
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0], err
    assert "no record written" in lines[0]
    assert list((tmp_path / "runs").glob("*.json")) == []
    assert not [p for p in (tmp_path / "logs").rglob("*") if p.is_file()], "the cancelled run's logs are gone"
