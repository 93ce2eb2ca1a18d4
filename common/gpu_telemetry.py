"""What nvidia-smi says of the GPUs a measurement runs on: their power limit and clocks, once, and a trace of power,
clocks and throttle reasons beside a measurement of minutes. A GPU held at its power cap computes slower than in a
burst, and a part capped lower than its datasheet (torchtitan's 500 W H100) slower still: the figures a table was
measured at are part of it (docs/prediction-at-scale.md, "Burst against sustained"). Where there is no nvidia-smi,
nothing is written and the caller says "not measured"."""
from __future__ import annotations

import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from common.devices import nvidia_smi_command

STATE = "name,memory.total,power.limit,clocks.max.sm,clocks.max.memory,driver_version"
TRACE = "timestamp,clocks.current.sm,clocks.current.memory,power.draw,temperature.gpu,clocks_event_reasons.active"
ASK_S = 30   # nvidia-smi answers a query in well under a second; one that hangs (a wedged driver) is given up
STOP_S = 10  # nvidia-smi's loop ends at SIGTERM at once; one that does not is killed after this


def state() -> str | None:
    """nvidia-smi's CSV of STATE (a header line, a line per GPU), or None where it cannot be asked."""
    cmd = nvidia_smi_command(STATE, "--format=csv")
    if cmd is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=ASK_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


@contextmanager
def trace(path: Path, interval_ms: int = 250) -> Iterator[bool]:
    """nvidia-smi sampling TRACE into `path` (CSV, no units) every `interval_ms` while the block runs; yields whether
    it runs. Stopped and reaped when the block ends, however it ends."""
    cmd = nvidia_smi_command(TRACE, "--format=csv,nounits", f"--loop-ms={interval_ms}")
    if cmd is None:
        yield False
        return
    with path.open("w") as out:
        sampler = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
    try:
        yield True
    finally:
        sampler.terminate()
        try:
            sampler.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.wait()


def samples(path: Path) -> list[tuple[float, float, float]]:
    """A trace's readable samples: (seconds since the epoch, SM clock in MHz, power draw in W). nvidia-smi writes its
    timestamps in the machine's local time, which the clock of the records beside it reads alike."""
    out = []
    for line in path.read_text().splitlines()[1:]:
        row = line.split(", ")
        try:
            out.append((datetime.strptime(row[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(row[1]), float(row[3])))
        except (ValueError, IndexError):  # a field nvidia-smi could not read ("[N/A]"), or a line cut off
            continue
    return out


def during(trace: list[tuple[float, float, float]], start: float, end: float) -> dict | None:
    """The median SM clock and power draw of the samples from `start` to `end` (seconds since the epoch), or None
    where none fell between them."""
    inside = [(clock, power) for t, clock, power in trace if start <= t <= end]
    if not inside:
        return None
    return {"samples": len(inside), "sm_clock_mhz": statistics.median(c for c, _ in inside),
            "power_w": statistics.median(p for _, p in inside)}


def trace_summary(path: Path) -> str:
    """One line of a trace: its samples, its power draw's largest and its SM clock's lowest and median."""
    read = samples(path)
    if not read:
        return "nvidia-smi trace: no readable sample"
    clocks = sorted(c for _, c, _ in read)
    return (f"nvidia-smi trace: {len(read)} samples; power draw up to {max(p for _, _, p in read):.0f} W; "
            f"SM clock {clocks[0]:.0f} MHz at the lowest, {clocks[len(clocks) // 2]:.0f} MHz the median")
