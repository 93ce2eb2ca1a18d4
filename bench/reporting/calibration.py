"""The report's calibration section: each backend against its framework's bare loop (bench.calibrate), and
where a step's time goes (--breakdown-steps), from the records' `calibration` and `backend_metrics`."""
from __future__ import annotations

from bench.reporting.document import Block, Heading, Table, Text
from bench.reporting.tables import fmt_ms, fmt_number
from common.breakdown import PHASES
from common.calibration import HARNESS_BOUND_BELOW
from common.sections import Breakdown, GradComm

PHASE_HEADERS = {"forward_backward_s": "fwd+bwd", "grad_comm_s": "grad comm", "optimizer_s": "optimizer",
                 "data_s": "data", "other_s": "other"}


def _key(r: dict):
    return r["workload"], r["backend"], r["devices"], r.get("started_at") or ""


def _latest(records: list[dict], has) -> list[dict]:
    """The newest ok record per (workload, backend, devices) that has what `has` looks for."""
    newest: dict[tuple, dict] = {}
    for r in sorted((r for r in records if r["status"] == "ok" and has(r)), key=_key):
        newest[_key(r)[:3]] = r
    return [newest[k] for k in sorted(newest)]


def _breakdown(r: dict) -> Breakdown | None:
    return Breakdown.from_metrics(r.get("backend_metrics"))


def calibration_blocks(records: list[dict]) -> list[Block]:
    calibrated = _latest(records, lambda r: (r.get("calibration") or {}).get("ratio"))
    if not calibrated:
        return []
    rows, bound = [], []
    for r in calibrated:
        c = r["calibration"]
        verdict = f"harness-bound ({c['ratio']:.2f})" if c["ratio"] < HARNESS_BOUND_BELOW else "ok"
        if c["ratio"] < HARNESS_BOUND_BELOW:
            bound.append(f"{r['backend']} {r['workload']} N={r['devices']}: {c['ratio']:.2f}")
        rows.append([r["workload"], r["backend"], str(r["devices"]), fmt_number(r["samples_per_s"]),
                     fmt_number(c["bare_samples_per_s"]), f"{c['ratio']:.2f}",
                     "" if c.get("spread") is None else f"{c['spread']:.2f}", str(c["repeats"]), verdict, c["idiom"]])
    blocks: list[Block] = [
        Heading("Calibration: the suite against each framework's bare loop", 2),
        Text(f"ratio = median suite samples/s / median bare-loop samples/s over alternated repeats; spread = "
             f"(max - min) of the per-repeat ratios / ratio. Below {HARNESS_BOUND_BELOW} the harness, not the "
             "framework, sets the pace (harness-bound)."),
        Table(["workload", "backend", "N", "suite samples/s", "bare samples/s", "ratio", "spread", "repeats",
               "verdict", "bare idiom"], rows)]
    if bound:
        blocks.append(Text("Harness-bound: " + "; ".join(bound) + "."))
    return blocks


def breakdown_blocks(records: list[dict]) -> list[Block]:
    probed = _latest(records, _breakdown)
    if not probed:
        return []
    rows = []
    for r in probed:
        b, comm = _breakdown(r), GradComm.from_metrics(r.get("backend_metrics"))
        step = b.step_s or b.probe_step_s
        times = [getattr(b, k) for k in (*PHASES, "other_s")]
        phases = [f"{fmt_ms(t)} ({t / step:.0%})" if step else fmt_ms(t) for t in times]
        bw = "" if not comm or not comm.busbw_GBps else f"{comm.busbw_GBps:.2f} / {comm.link_GBps or 0:.2f}"
        rows.append([r["workload"], r["backend"], str(r["devices"]), *phases, fmt_ms(b.step_s),
                     fmt_ms(b.probe_step_s), fmt_number((comm.bytes_per_step if comm else 0) / 2**20),
                     bw, fmt_ms(comm.ring_bound_s if comm else None), b.source])
    return [
        Heading("Where a step's time goes", 2),
        Text("Phases in ms per step (share of the measured median step), timed in probe steps after the measured "
             "window with the device synchronised between phases; 'probe step' is their own total. Gradient "
             "communication: MiB all-reduced per step, achieved bus bandwidth 2(N-1)/N x bytes / time against the "
             "link's (a plain all-reduce on the same collective, measured at run time), and the ring bound."),
        Table(["workload", "backend", "N", *(f"{PHASE_HEADERS[k]} ms" for k in (*PHASES, "other_s")),
               "step ms", "probe step ms", "grad MiB", "busbw / link GB/s", "ring bound ms", "timed by"], rows)]
