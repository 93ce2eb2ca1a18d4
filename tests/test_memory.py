"""common.memory: the training's own memory, through the kernel's high-water mark and an allocator's counters."""
from __future__ import annotations

import mmap
import tracemalloc

import pytest

from common import memory
from common.memory import MemoryWindow, memory_section, proc_status, reset_hwm

MIB = 1 << 20


def _process_peak() -> int:
    return proc_status()["VmHWM"]


def _touch(nbytes: int) -> None:
    """Make `nbytes` of fresh pages resident and give them back: an anonymous mapping, every page written, then
    unmapped. Fresh whatever the C allocator holds (an array of the size can reuse pages already resident: measured
    under mutmut, where a 64 MiB np.ones left VmRSS unchanged)."""
    pages = mmap.mmap(-1, nbytes)
    for offset in range(0, nbytes, mmap.PAGESIZE):
        pages[offset] = 1
    pages.close()


def test_proc_reset_forgets_the_old_peak_and_the_window_measures_a_real_allocation():
    _touch(64 * MIB)  # a peak reached before the window: start-up, not training
    assert proc_status()["VmHWM"] > proc_status()["VmRSS"] + 32 * MIB
    rss = reset_hwm()
    assert rss is not None and proc_status()["VmHWM"] < rss + 32 * MIB

    window = MemoryWindow(None, _process_peak)
    window.open()
    _touch(96 * MIB)
    training = window.close()
    assert window.method == "proc" and window.at_start > 0
    assert 90 * MIB <= training < 160 * MIB
    assert "VmHWM" in window.description("")


def test_a_paused_window_leaves_out_what_ran_in_the_pause():
    window = MemoryWindow(None, _process_peak)
    window.open()
    window.pause()
    _touch(128 * MIB)  # an evaluation's memory, outside the training's
    window.resume()
    _touch(64 * MIB)
    assert 56 * MIB <= window.close() < 120 * MIB


def test_the_process_peak_keeps_what_was_reached_before_the_reset():
    _touch(64 * MIB)
    peak_then = _process_peak()
    window = MemoryWindow(None, _process_peak)
    window.open()
    window.close()
    assert window.process_peak() >= peak_then > _process_peak()


def test_an_allocator_s_counters_come_first():
    """Python's own allocator counters (tracemalloc) stand for a framework's: held now, peak, reset. The
    figure is the peak the counter read at the end less what it held at the start, whatever else the
    interpreter allocated or freed meanwhile (mutmut's instrumentation does); the 24 MiB are in it."""
    readings = []

    def allocator(reset: bool):
        held, peak = tracemalloc.get_traced_memory()
        readings.append((held, peak))
        if reset:
            tracemalloc.reset_peak()
        return held, peak

    tracemalloc.start()
    try:
        weights = bytearray(8 * MIB)
        window = MemoryWindow(allocator, _process_peak)
        window.open()
        activations = bytearray(24 * MIB)
        del activations
        training = window.close()
    finally:
        tracemalloc.stop()
    (held_at_start, _), (_, peak_at_end) = readings[0], readings[-1]
    assert window.method == "allocator" and window.at_start == held_at_start >= 8 * MIB
    assert training == peak_at_end - held_at_start
    assert abs(training - 24 * MIB) < MIB
    assert "tracemalloc" in window.description("tracemalloc")
    del weights


def _counter(fails_at: set[int], held: int = 100, peaks: tuple[int, ...] = (150, 400)):
    """An allocator's counters: readings 1, 2, ... (open, each pause, each resume) answer (held, peak so far),
    except those in `fails_at`, which raise."""
    calls = []

    def read(reset: bool):
        calls.append(reset)
        if len(calls) in fails_at:
            raise RuntimeError("the device is gone")
        return held, (held if len(calls) == 1 else peaks[min(len(calls), len(peaks)) - 1])
    return read


def test_a_counter_that_fails_makes_the_figure_null_not_the_run():
    def broken(reset: bool):
        raise RuntimeError("no device")

    window = MemoryWindow(broken, _process_peak)
    window.open()  # falls back to /proc
    assert window.method == "proc" and window.at_start > 0
    # A counter that answers at the start and then fails: no figure (not the /proc one, not a partial peak),
    # whether it fails at the first segment's end (2), at the resume (3, also when it answers again after) or at
    # the last segment's end (4).
    for fails_at in ({2, 3, 4}, {3, 4}, {3}, {4}):
        window = MemoryWindow(_counter(fails_at), _process_peak)
        window.open()
        assert window.method == "allocator" and window.at_start == 100
        window.pause()
        window.resume()
        assert window.close() is None, fails_at
        assert window.method is None and window.description("x") is None
    # One that keeps answering: the highest segment's peak over the start.
    window = MemoryWindow(_counter(set()), _process_peak)
    window.open()
    window.pause()
    window.resume()
    assert window.close() == 400 - 100


def test_pages_given_back_in_a_pause_are_not_taken_from_the_training(monkeypatch):
    """/proc scripted: RSS 1000 MiB at the start; a first segment that grows 10 MiB; an evaluation in the pause
    whose freeing lets the C allocator trim 200 MiB it held before the window; then the training grows 64 MiB.
    The training's figure is the largest segment's growth over the level that segment started from: 64 MiB (the
    RSS against the start alone would say 0; the first segment's peak against the lowered level, 210)."""
    rss = iter([1000 * MIB, 800 * MIB])                          # at open, at resume
    hwm = iter([1010 * MIB, 864 * MIB])                          # at the pause, at close
    monkeypatch.setattr(memory, "reset_hwm", lambda: next(rss))
    monkeypatch.setattr(memory, "proc_status", lambda: {"VmHWM": next(hwm), "VmRSS": 0})
    window = MemoryWindow(None, lambda: 0)
    window.open()
    window.pause()
    window.resume()
    assert window.close() == 64 * MIB and (window.method, window.at_start) == ("proc", 1000 * MIB)


@pytest.mark.parametrize("share", [False, True])
def test_the_section_says_per_rank_and_whether_processes_share_devices(share):
    ranks = [{"process_peak": 3, "training": 1, "at_start": 2, "method": "m"},
             {"process_peak": 5, "training": None, "at_start": None, "method": "m"}]
    section = memory_section(ranks, share)
    assert section["process_peak_per_rank"] == [3, 5] and section["training_per_rank"] == [1, None]
    assert section["processes_share"] is share
    assert ("divide" in section["method"]) is share


def _status(tmp_path, rss_kb: int, hwm_kb: int) -> str:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython\nVmPeak:\t 999 kB\nVmHWM:\t {hwm_kb} kB\nVmRSS:\t {rss_kb} kB\nThreads:\t1\n")
    return str(path)


def test_the_kernel_s_figures_read_and_a_reset_it_ignored_is_not_trusted(tmp_path, monkeypatch):
    """/proc read through files of known content: kB to bytes; a missing field or file says nothing; a reset is
    trusted only where VmHWM then reads within 1 MiB of VmRSS."""
    monkeypatch.setattr(memory, "STATUS", memory.Path(_status(tmp_path, 2048, 4096)))
    assert proc_status() == {"VmRSS": 2048 * 1024, "VmHWM": 4096 * 1024}
    clear = tmp_path / "clear_refs"
    monkeypatch.setattr(memory, "CLEAR_REFS", clear)
    assert reset_hwm() is None and clear.read_text() == "5"  # the kernel left a peak 2 MiB above: ignored
    monkeypatch.setattr(memory, "STATUS", memory.Path(_status(tmp_path, 2048, 2048 + 1024)))
    assert reset_hwm() == 2048 * 1024                          # 1 MiB above: pages faulted in between
    monkeypatch.setattr(memory, "STATUS", memory.Path(_status(tmp_path, 2048, 2048 + 1025)))
    assert reset_hwm() is None
    monkeypatch.setattr(memory, "CLEAR_REFS", tmp_path)        # a directory: the write fails
    assert reset_hwm() is None
    (tmp_path / "status").write_text("VmRSS:\t 10 kB\n")
    assert proc_status() is None
    monkeypatch.setattr(memory, "STATUS", tmp_path / "gone")
    assert proc_status() is None


def test_a_kernel_that_refuses_the_reset_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "CLEAR_REFS", tmp_path)  # not writable as a file
    peaks = iter([7, 5])
    window = MemoryWindow(None, lambda: next(peaks))
    window.open()
    assert (window.method, window.at_start) == (None, None)
    window.pause()
    window.resume()
    assert window.close() is None and window.description("x") is None
    assert window.process_peak() == 7  # the peak before the window, kept


def test_the_section_names_each_rank_s_method_where_they_differ():
    ranks = [{"process_peak": 3, "training": 1, "at_start": 2, "method": "a"},
             {"process_peak": 5, "method": "b"}]
    section = memory_section(ranks, False)
    assert section == {"process_peak_per_rank": [3, 5], "training_per_rank": [1, None], "at_start_per_rank": [2, None],
                       "method": "rank 0: a; rank 1: b", "processes_share": False}
    shared = memory_section([{"process_peak": 1, "method": None}], True)["method"]
    assert shared == "not measured; one process drives several devices: per device, divide a process's figure by " \
                     "its devices"
    assert memory_section([{"process_peak": 1, "method": "a"}] * 2, False)["method"] == "a"


def test_the_process_peak_is_getrusage_s_in_bytes():
    """ru_maxrss is in KiB on Linux (getrusage(2)); the kernel updates it lazily and clear_refs (the windows above)
    resets it with VmHWM, so it is held to the order of what the process holds now, not above it."""
    import resource

    peak = memory.resident_peak_bytes()
    assert peak == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > proc_status()["VmRSS"] / 2


def test_each_read_asks_for_the_right_reset_and_keeps_the_highest_segment(tmp_path, monkeypatch):
    resets = []

    def counter(peaks):
        it = iter(peaks)

        def read(reset):
            resets.append(reset)
            return 100, next(it)
        return read
    window = MemoryWindow(counter([100, 400, 100, 150]), _process_peak)
    window.open()
    window.pause()
    window.resume()
    assert window.close() == 300  # the first segment's 400, not the last one's 150
    assert resets == [True, False, True, False]  # open and resume reset the peak; the segment ends only read it
    flat = MemoryWindow(counter([100, 100]), _process_peak)
    flat.open()
    assert flat.close() == 0
    # /proc that stops answering mid-window: nothing measured
    window = MemoryWindow(None, _process_peak)
    window.open()
    assert window.method == "proc"  # as test_proc_reset_forgets_the_old_peak... holds: Linux >= 4.0
    monkeypatch.setattr(memory, "STATUS", tmp_path / "gone")
    assert window.close() is None and window.method is None
