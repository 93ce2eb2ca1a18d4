"""The training's own memory: what a process holds at the peak of its training steps beyond what it held
when they began (weights built, data loaded), beside the process's peak over its whole life.

Two mechanisms, one per kind of device, each degrading to "not measured" (None), never failing a run:
- a framework's allocator counters (GPUs: torch.cuda, tf.config.experimental, mindspore.runtime), offered
  by a trainer's optional `allocator_memory` method (common.loop.Trainer);
- the kernel's resident-set high-water mark (CPUs): writing "5" to /proc/self/clear_refs resets VmHWM to
  the current VmRSS (Linux >= 4.0, proc(5)); VmHWM at the end is the window's peak.

The process peak the record keeps (`peak_memory_bytes`) is the trainer's own figure; resetting a counter
would lose the part of it reached before the window (start-up), so the window reads it before resetting.
"""
from __future__ import annotations

import re
import resource
from collections.abc import Callable
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_HWM = "5"  # proc(5): "5" resets the peak resident set size ("high water mark") to the current one

PROC_METHOD = ("growth of the process's resident set (Linux VmHWM, reset through /proc/self/clear_refs just "
               "before the first training step) over its VmRSS then: gradients, optimizer state, activations "
               "and the allocator's retained pages; weights, data and the interpreter are in the start")
ALLOCATOR_METHOD = ("growth of the framework allocator's peak ({what}, reset just before the first training "
                    "step) over what it held then: gradients, optimizer state and activations; the weights "
                    "are in the start")

# (bytes held now, the peak since the last reset) from an allocator; reset=True resets the peak after reading.
Allocator = Callable[[bool], "tuple[int, int] | None"]


def resident_peak_bytes() -> int:
    """This process's peak resident set (getrusage's ru_maxrss: KiB on Linux): a trainer's process peak on a CPU."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def proc_status() -> dict[str, int] | None:
    """VmRSS and VmHWM of this process in bytes; None where /proc does not say them."""
    try:
        text = STATUS.read_text()
    except OSError:
        return None
    found = {k: re.search(rf"^{k}:\s+(\d+) kB", text, re.MULTILINE) for k in ("VmRSS", "VmHWM")}
    if not all(found.values()):
        return None
    return {k: int(m.group(1)) * 1024 for k, m in found.items()}


def reset_hwm() -> int | None:
    """Reset this process's VmHWM to its VmRSS; the VmRSS then (bytes), or None where the kernel refuses.
    A reset is trusted only when VmHWM reads no higher than VmRSS after it (a kernel that took the write and
    ignored it would leave the old peak)."""
    try:
        CLEAR_REFS.write_text(RESET_HWM)
    except OSError:
        return None
    now = proc_status()
    # Pages faulted in between the two reads count in both; a failed reset leaves the old, far higher peak.
    if now is None or now["VmHWM"] > now["VmRSS"] + (1 << 20):
        return None
    return now["VmRSS"]


class MemoryWindow:
    """The training steps' memory on this rank: open() before the first step, pause()/resume() around what is
    not training (an evaluation), close() after the last step."""

    def __init__(self, allocator: Allocator | None, process_peak: Callable[[], int]):
        self._allocator, self._process_peak = allocator, process_peak
        self.method: str | None = None
        self.at_start: int | None = None
        self._base: int | None = None       # what the current segment's growth counts from
        self._growth: int | None = None     # the largest growth of the closed segments over their base
        self._before = 0                    # the process peak when the window opened

    def _read_allocator(self, reset: bool) -> tuple[int, int] | None:
        try:
            return self._allocator(reset) if self._allocator else None
        except Exception:  # noqa: BLE001 - a counter that fails makes the figure null, never the run
            return None

    def open(self) -> None:
        self._before = self._process_peak()
        self._reset(first=True)

    def _reset(self, first: bool) -> None:
        if first or self.method == "allocator":
            reading = self._read_allocator(reset=True)
            if reading is not None:
                self.method = "allocator"
                if first:
                    self.at_start = self._base = reading[0]
                return
            if not first:  # the counter stopped answering: nothing is measured
                self.method = self.at_start = None
                return
        rss = reset_hwm()
        if rss is None:
            self.method = self.at_start = None
        elif first:
            self.method, self.at_start, self._base = "proc", rss, rss
        elif rss < self._base:
            # The process gave pages back during the pause (the C allocator trims its heap once the paused work
            # frees): they were held before the training and are not the training's, so the next segment's
            # growth counts from the lower level (else the training after the pause could read as nothing).
            self._base = rss

    def pause(self) -> None:
        """End a segment of training: its peak is kept."""
        if self.method == "allocator":
            reading = self._read_allocator(reset=False)
            peak = reading[1] if reading else None
        elif self.method == "proc":
            status = proc_status()
            peak = status["VmHWM"] if status else None
        else:
            return
        if peak is None:
            self.method = self.at_start = None  # the counter stopped answering: nothing is measured
            return
        growth = max(0, peak - self._base)
        self._growth = growth if self._growth is None else max(self._growth, growth)

    def resume(self) -> None:
        if self.method is not None:
            self._reset(first=False)

    def close(self) -> int | None:
        """The training's own bytes (the largest growth of a segment over the level it started from), or None: not
        measured."""
        self.pause()
        return None if self.method is None else self._growth

    def process_peak(self) -> int:
        """The trainer's process peak, counting what it reached before the window reset the counters."""
        return max(self._before, self._process_peak())

    def description(self, allocator_what: str) -> str | None:
        if self.method == "allocator":
            return ALLOCATOR_METHOD.format(what=allocator_what)
        return PROC_METHOD if self.method == "proc" else None


def memory_section(ranks: list[dict], processes_share: bool) -> dict:
    """The record's top-level `memory` from each rank's {"process_peak", "training", "method"}."""
    methods = [r.get("method") for r in ranks]
    method = methods[0] if len(set(methods)) == 1 else "; ".join(f"rank {i}: {m}" for i, m in enumerate(methods))
    if processes_share:
        method = (f"{method or 'not measured'}; one process drives several devices: per device, divide a "
                  "process's figure by its devices")
    return {"process_peak_per_rank": [r["process_peak"] for r in ranks],
            "training_per_rank": [r.get("training") for r in ranks],
            "at_start_per_rank": [r.get("at_start") for r in ranks],
            "method": method, "processes_share": processes_share}
