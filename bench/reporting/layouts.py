"""Per workload, the layout table: what each data x tensor x pipeline layout costs in speed, memory and traffic.

Its runs are every run of a `bench.compare --layouts` sweep (sweep ids starting LAYOUT_SWEEP_PREFIX) and any
other run whose layout splits the model or shards its state. Efficiency is held against the 1-device run of
the same global batch and micro-batching and the rest of the configuration key alike, in the same sweep
(common.config_key.reference_key): a layout at N devices is ideal when it trains N times as many samples per
second as that run.
"""
from __future__ import annotations

import pandas as pd

from bench.reporting.tables import fmt_efficiency, fmt_number, fmt_share
from common.config_key import NO_REFERENCE, efficiency, reference_throughputs
from common.layout import Layout
from common.sections import COMM_KINDS, STATE_PARTS, Bubble, CommPerStep, Memory, StateBytesPerRank

LAYOUT_SWEEP_PREFIX = "layouts-"
FRAME_COLUMNS = ("run_id", "layout", "sweep_id", "host", "backend", "workload", "data", "devices", "device_kind",
                 "global_batch", "accumulation", "status", "samples_per_s", "started_at")
# peak memory: the process's (common.loop); training memory: the growth from the first step to the peak of the
# training steps (common.memory), which shows what sharding and splitting save where the process peak hides it.
COLUMNS = ["layout", "backend", "N", "status", "samples/s", "efficiency vs 1 device", "MFU (measured peak)",
           "peak memory max (MiB)", "peak memory per rank (MiB)", "training memory per rank (MiB)",
           "params+grads+optimizer per rank (MiB)", "bubble analytic", "bubble measured per stage",
           "communication per step per rank (MiB)", "compile (s)", "reason / notes"]


def _splits(layout: dict | None) -> bool:
    if not layout:
        return False
    name = Layout.from_record(layout)
    return bool(name.features())


def in_layout_table(record: dict) -> bool:
    return str(record.get("sweep_id") or "").startswith(LAYOUT_SWEEP_PREFIX) or _splits(record.get("layout"))


def accumulation(record: dict) -> int:
    """Micro-batches per optimizer step of a recorded run (Layout.accumulation)."""
    grad_accum = (record.get("config") or {}).get("grad_accum") or 1
    return Layout.from_record(record.get("layout") or {}).accumulation(grad_accum)


def layout_name(record: dict) -> str:
    layout = record.get("layout")
    if not layout:
        return "?"
    name = Layout.from_record(layout).name
    if record["devices"] == 1 and accumulation(record) > 1:
        name += f", {accumulation(record)} micro-batches"
    return name


def layout_frame(records: list[dict]) -> pd.DataFrame:
    """One row per run of the layout table, with its reference's throughput and the efficiency against it."""
    rows = []
    references = reference_throughputs(records)
    for r in records:
        if not in_layout_table(r):
            continue
        rows.append({"run_id": r["run_id"], "layout": layout_name(r), "sweep_id": r.get("sweep_id") or "",
                     "host": (r.get("host") or {}).get("name"), "backend": r["backend"], "workload": r["workload"],
                     "data": r.get("data"), "device_kind": r.get("device_kind"), "devices": r["devices"],
                     "global_batch": r.get("global_batch"), "accumulation": accumulation(r), "status": r["status"],
                     "samples_per_s": r.get("samples_per_s"), "started_at": r.get("started_at") or "",
                     "reference_samples_per_s": references.get(r["run_id"], float("nan"))})
    frame = pd.DataFrame(rows, columns=[*FRAME_COLUMNS, "reference_samples_per_s"])
    frame["efficiency"] = [efficiency(s, n, ref) if ref == ref else float("nan")
                           for s, n, ref in zip(frame.samples_per_s, frame.devices, frame.reference_samples_per_s)]
    frame = frame.sort_values(["started_at", "run_id"], kind="stable").reset_index(drop=True)
    # The frameworks side by side: each layout's rows together, one per backend.
    return frame.sort_values(["workload", "sweep_id", "host", "devices", "layout", "backend"], kind="stable")


def mib(nbytes) -> float:
    return nbytes / 2**20


def _per_rank(values) -> str:
    return ", ".join("?" if v is None else f"{mib(v):,.1f}" for v in values) if values else ""


def _training(memory: Memory | None) -> str:
    """Per rank, and per process where one process drives several devices."""
    if not memory or not any(v is not None for v in memory.training_per_rank):
        return ""
    return _per_rank(memory.training_per_rank) + (" (per process)" if memory.processes_share else "")


def _state(state: StateBytesPerRank | None) -> str:
    """params+grads+optimizer per rank, e.g. '2.1+2.1+4.2, 2.1+2.1+4.2'."""
    if not state:
        return ""
    return ", ".join("+".join(f"{mib(getattr(rank, part)):,.1f}" for part in STATE_PARTS) for rank in state.ranks)


def _bubble(bubble: Bubble | None) -> tuple[str, str]:
    if not bubble:
        return "", ""
    return fmt_share(bubble.analytic), ", ".join(fmt_share(v) for v in bubble.measured_per_stage or [])


def _comm(comm: CommPerStep | None) -> str:
    """Per kind that moved bytes, its bytes on each rank: 'all_reduce 1.23, 1.23; send_recv 0.5, 0.5'."""
    if not comm:
        return ""
    ranks = range(len(comm.ranks))
    seen = {k for step in comm.ranks for k in (step or {})}
    kinds = [k for k in COMM_KINDS if any(comm.bytes_of(r, k) for r in ranks)] + sorted(seen - set(COMM_KINDS))
    return "; ".join(f"{kind} " + ", ".join(f"{mib(comm.bytes_of(r, kind)):.3g}" for r in ranks)
                     for kind in kinds) or "none"


def _remark(record: dict, row) -> str:
    if record["status"] != "ok":
        return str(record.get("error") or "")
    notes = ["oversubscribed: devices x threads > cores"] if record.get("oversubscribed") else []
    if row.efficiency != row.efficiency and record["devices"] > 1:
        notes.append(f"{NO_REFERENCE} (the same global batch and micro-batches) in its sweep")
    return "; ".join(notes)


def layout_table(frame: pd.DataFrame, records_by_id: dict[str, dict], workload: str
                 ) -> tuple[list[str], list[list[str]]]:
    """Columns and formatted rows of one workload's layout table."""
    body = []
    for row in frame[frame.workload == workload].itertuples():
        r = records_by_id[row.run_id]
        metrics = r.get("backend_metrics") or {}
        peaks = r.get("peak_memory_per_rank") or ([r["peak_memory_bytes"]] if r.get("peak_memory_bytes") else [])
        analytic, measured = _bubble(Bubble.from_metrics(metrics))
        body.append([row.layout, row.backend, str(row.devices), row.status, fmt_number(row.samples_per_s),
                     fmt_efficiency(row.efficiency), fmt_share(r.get("mfu_achievable")),
                     fmt_number(mib(max(peaks))) if peaks else "", _per_rank(peaks),
                     _training(Memory.from_record(r)), _state(StateBytesPerRank.from_metrics(metrics)),
                     analytic, measured,
                     _comm(CommPerStep.from_metrics(metrics)), fmt_number(metrics.get("compile_s")),
                     _remark(r, row)])
    return COLUMNS, body
