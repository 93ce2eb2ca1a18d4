"""common.gpu_telemetry: nvidia-smi's state and trace beside a measurement. This machine has no NVIDIA driver, so the
trace's handling (started, written, stopped and reaped however the block ends) is held here with a stand-in for
nvidia-smi on PATH: a script that answers its two queries as nvidia-smi does; a lent GPU runs the real one."""
from __future__ import annotations

import csv
import os
import statistics
import time
from datetime import datetime
from pathlib import Path

import pytest

from common import devices, gpu_telemetry

REPO = Path(__file__).resolve().parent.parent
H100_TRACE = REPO / "results/reference/h100x1/sustained/nvidia-smi-trace.csv"

STAND_IN = """#!/bin/sh
echo $$ >> "{pids}"
echo "$*" >> "{args}"
{behaviour}
case "$*" in
  *--loop-ms*) echo "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, \
clocks_event_reasons.active"
    i=0  # at most 20 s: a sampler the code under test fails to stop must not outlive the test run for long
    while [ $i -lt 400 ]; do echo "2026/11/29 10:00:00.000, 1980, 3201, 650.5, 60, 0x0000000000000000"; sleep 0.05
      i=$((i + 1)); done ;;
  *) echo "name, memory.total [MiB], power.limit [W], clocks.max.sm [MHz], clocks.max.memory [MHz], driver_version"
     echo "NVIDIA H200, 143771 MiB, 700.00 W, 1980 MHz, 3201 MHz, 580.159.04" ;;
esac
"""
# How the stand-in misbehaves: deaf to SIGTERM, failing (what it printed before exiting 9), hanging.
BEHAVIOUR = {"answers": "", "deaf": "trap '' TERM", "fails": 'echo "name"; exit 9', "hangs": "sleep 20"}


def stand_in(tmp_path: Path, monkeypatch, behaviour: str = "answers") -> Path:
    """A stand-in nvidia-smi first on PATH, a driver 'present'; returns the file each of its runs writes its pid to
    (and beside it `args`, each run's arguments on a line)."""
    pids, args = tmp_path / "pids", tmp_path / "args"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(STAND_IN.format(pids=pids, args=args, behaviour=BEHAVIOUR[behaviour]))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(devices, "accelerator_driver_present", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return pids


def _gone(pid: int) -> bool:
    """Neither running nor a zombie left unreaped (a zombie still answers signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_without_nvidia_smi_nothing_is_asked_and_nothing_written(tmp_path):
    assert not devices.accelerator_driver_present()  # this machine: a GPU's test would need no stand-in
    assert gpu_telemetry.state() is None
    with gpu_telemetry.trace(tmp_path / "t.csv") as tracing:
        assert tracing is False
    assert not (tmp_path / "t.csv").exists()


def test_the_trace_samples_while_the_block_runs_and_its_sampler_is_reaped(tmp_path, monkeypatch):
    pids = stand_in(tmp_path, monkeypatch)
    assert gpu_telemetry.state().splitlines()[1].startswith("NVIDIA H200, 143771 MiB, 700.00 W")
    with pytest.raises(RuntimeError), gpu_telemetry.trace(tmp_path / "t.csv", interval_ms=50) as tracing:
        assert tracing is True
        time.sleep(0.5)
        raise RuntimeError("the measurement failed")  # the sampler stops all the same
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].startswith("timestamp, clocks.current.sm") and len(lines) >= 4
    sampler = int(pids.read_text().split()[-1])
    assert _gone(sampler)
    # what nvidia-smi was asked: the state once, with its units; then the trace's fields without them, in a loop
    assert (tmp_path / "args").read_text().splitlines() == [
        f"--query-gpu={gpu_telemetry.STATE} --format=csv",
        f"--query-gpu={gpu_telemetry.TRACE} --format=csv,nounits --loop-ms=50"]
    assert gpu_telemetry.trace_summary(tmp_path / "t.csv") == (
        f"nvidia-smi trace: {len(lines) - 1} samples; power draw up to 650 W; SM clock 1980 MHz at the lowest, "
        "1980 MHz the median")


def test_a_sampler_deaf_to_sigterm_is_killed(tmp_path, monkeypatch):
    pids = stand_in(tmp_path, monkeypatch, "deaf")
    monkeypatch.setattr(gpu_telemetry, "STOP_S", 0.3)
    started = time.monotonic()
    with gpu_telemetry.trace(tmp_path / "t.csv", interval_ms=50):
        time.sleep(0.2)
    assert time.monotonic() - started < 5 and _gone(int(pids.read_text().split()[-1]))


def test_the_summary_of_the_h100_s_sustained_trace():
    with H100_TRACE.open() as f:
        rows = list(csv.reader(f, skipinitialspace=True))[1:]
    clocks = sorted(float(r[1]) for r in rows)
    power = max(float(r[3]) for r in rows)
    assert gpu_telemetry.trace_summary(H100_TRACE) == (
        f"nvidia-smi trace: {len(rows)} samples; power draw up to {power:.0f} W; SM clock {clocks[0]:.0f} MHz at "
        f"the lowest, {clocks[len(clocks) // 2]:.0f} MHz the median")
    assert statistics.median(clocks) > clocks[0]  # the trace runs from idle (345 MHz) into the load


def test_a_trace_s_timestamps_are_the_machine_s_local_time_and_a_window_takes_its_samples():
    read = gpu_telemetry.samples(H100_TRACE)
    assert read[0] == (datetime(2026, 11, 27, 11, 20, 58, 686000).timestamp(), 345.0, 72.87)
    start, end = read[10][0], read[20][0]
    assert gpu_telemetry.during(read, start, end) == {
        "samples": 11, "sm_clock_mhz": statistics.median(c for _, c, _ in read[10:21]),
        "power_w": statistics.median(p for _, _, p in read[10:21])}
    assert gpu_telemetry.during(read, end + 1e6, end + 2e6) is None


@pytest.mark.parametrize("behaviour", ["fails", "hangs"])
def test_an_nvidia_smi_that_fails_or_hangs_gives_no_state(tmp_path, monkeypatch, behaviour):
    stand_in(tmp_path, monkeypatch, behaviour)
    monkeypatch.setattr(gpu_telemetry, "ASK_S", 0.5)
    started = time.monotonic()
    assert gpu_telemetry.state() is None and time.monotonic() - started < 5


def test_a_trace_summary_by_hand_reads_past_an_unreadable_sample(tmp_path):
    header = "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, x\n"
    trace = tmp_path / "t.csv"
    trace.write_text(header + "2026/11/29 10:00:00.000, 1500, 3201, 600.0, 60, 0x0\n"
                     "2026/11/29 10:00:00.250, [N/A], 3201, [N/A], 60, 0x0\n"
                     "2026/11/29 10:00:00.500, 1980, 3201, 699.6, 61, 0x0\n"
                     "2026/11/29 10:00:00.750, 1700, 3201, 650.0, 61, 0x0\n")
    assert gpu_telemetry.trace_summary(trace) == (
        "nvidia-smi trace: 3 samples; power draw up to 700 W; SM clock 1500 MHz at the lowest, 1700 MHz the median")
    trace.write_text(header + "2026/11/29 10:00:00.250, [N/A], 3201, [N/A], 60, 0x0\n")
    assert gpu_telemetry.trace_summary(trace) == "nvidia-smi trace: no readable sample"
