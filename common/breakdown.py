"""Where a step's time goes, and how close its gradient all-reduce comes to the link: the framework-neutral
arithmetic. Backends time the phases in probe steps outside the measured window (common.loop runs them);
this module turns those times into the record's `backend_metrics.breakdown` and `backend_metrics.grad_comm`.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): a ring all-reduce of S bytes over N ranks moves
2(N-1)/N x S bytes through each rank's link, so busbw = 2(N-1)/N x S / t is comparable to the link's
bandwidth whatever N, and the ring's lower bound on t is 2(N-1)/N x S / link bandwidth.
"""
from __future__ import annotations

import numpy as np

from common.predict.collectives import bus_factor
from common.sections import Breakdown, GradComm

PHASES = ("forward_backward_s", "grad_comm_s", "optimizer_s", "data_s")
GB = 1e9


def ring_factor(ranks: int) -> float:
    """Bytes through each rank's link per byte all-reduced, for a ring over `ranks`."""
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0


def bus_bandwidth_gbps(nbytes: float, seconds: float, ranks: int, kind: str = "all_reduce") -> float | None:
    """nccl-tests' busbw in GB/s (1e9 bytes) of a collective of that kind, None when nothing crossed a link or
    nothing was timed."""
    if ranks < 2 or not nbytes or not seconds or seconds <= 0:
        return None
    return bus_factor(kind, ranks) * nbytes / seconds / GB


def ring_bound_s(nbytes: float, ranks: int, link_gbps: float | None) -> float | None:
    """The least time a ring all-reduce of `nbytes` can take on links of `link_gbps`."""
    if ranks < 2 or not link_gbps:
        return None
    return ring_factor(ranks) * nbytes / (link_gbps * GB)


def summarize_breakdown(probes: list[dict[str, float]], measured_step_s: float | None, source: str) -> dict:
    """The phases of the median probe step (the two middle ones averaged when their number is even), so that
    they add up to `probe_step_s`, the probe steps' median: medians taken phase by phase need not (on a loaded
    machine one step's forward is long and another's communication, and the medians of each miss both).
    `other_s` is what the probe step took beyond its timed phases (Python, loss read-back, launches), never
    negative; `step_s` the median step of the measured window, which the phases should add up to when the probe
    reproduces the step."""
    ordered = sorted(probes, key=lambda p: p["step_s"])
    middle = ordered[(len(ordered) - 1) // 2: len(ordered) // 2 + 1]

    def mean(values) -> float:
        return float(np.mean(list(values)))
    phases = {k: mean(p.get(k) or 0.0 for p in middle) for k in PHASES}
    other = mean(max(0.0, p["step_s"] - sum(p.get(k) or 0.0 for k in PHASES)) for p in middle)
    return {**phases, "other_s": other, "probe_step_s": mean(p["step_s"] for p in middle),
            "step_s": measured_step_s, "source": source, "probe_steps": len(probes)}


def breakdown_total(breakdown: dict) -> float:
    """The phases of one step added up: what `step_s` should come to."""
    return sum(breakdown[k] for k in (*PHASES, "other_s"))


def grad_comm_summary(bytes_per_step: float, time_s: float, ranks: int, link_gbps: float | None,
                      source: str) -> dict:
    """The record's grad_comm: bytes reduced per step, their time, achieved busbw against the ring bound."""
    return {"bytes_per_step": int(bytes_per_step), "time_s": time_s,
            "busbw_GBps": bus_bandwidth_gbps(bytes_per_step, time_s, ranks), "link_GBps": link_gbps,
            "ring_bound_s": ring_bound_s(bytes_per_step, ranks, link_gbps), "ranks": ranks, "source": source}


def link_gbps_from_probe(nbytes: float, times_s: list[float], ranks: int) -> float | None:
    """The link's bandwidth from a few timed all-reduces of `nbytes`: the busbw of the fastest."""
    return bus_bandwidth_gbps(nbytes, min(times_s), ranks) if times_s else None


def kinds_gbps_from_probe(nbytes: float, times_s: dict[str, list[float]], ranks: int) -> dict[str, float] | None:
    """Per kind of collective, the bus bandwidth of the fastest of a few timed calls of `nbytes` (the whole
    buffer), by nccl-tests' factor for that kind; None when nothing was probed."""
    found = {kind: bus_bandwidth_gbps(nbytes, min(times), ranks, kind) for kind, times in times_s.items() if times}
    return {kind: gbps for kind, gbps in found.items() if gbps} or None


def communication_note(record: dict, collective: str) -> str | None:
    """Where a data-parallel step's time went, in words from the record's own breakdown (for `notes`): the
    all-reduce's share of the step, its bus bandwidth against the link's, and whether it hid behind compute."""
    metrics = record.get("backend_metrics")
    b, comm = Breakdown.from_metrics(metrics), GradComm.from_metrics(metrics)
    if b is None or comm is None or not b.step_s or not b.grad_comm_s or not comm.busbw_GBps:
        return None
    step, comm_s = b.step_s, b.grad_comm_s
    link = f"{comm.link_GBps:.2f} GB/s" if comm.link_GBps else "unmeasured"
    bound = f", ring bound {comm.ring_bound_s * 1e3:.0f} ms" if comm.ring_bound_s else ""
    return (f"measured breakdown ({b.probe_steps} probe steps): gradient all-reduce ({collective}) "
            f"{comm_s * 1e3:.0f} ms of the {step * 1e3:.0f} ms step ({comm_s / step:.0%}), "
            f"{comm.bytes_per_step / 2**20:.1f} MiB at bus bandwidth {comm.busbw_GBps:.2f} GB/s against "
            f"{link} for one plain all-reduce{bound}; forward+backward {b.forward_backward_s * 1e3:.0f} ms, "
            f"optimizer {b.optimizer_s * 1e3:.0f} ms (every rank updates every parameter), data feed "
            f"{b.data_s * 1e3:.1f} ms; the phases timed apart add up to {b.total_s * 1e3:.0f} ms")
