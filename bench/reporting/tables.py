"""Per workload, the table backend x devices: one row per run, failed and unsupported ones with their reason."""
from __future__ import annotations

import math

import pandas as pd

from bench.reporting.series import describe_field, throughput_unit, varying_fields

SORT_KEYS = ("backend", "strategy", "host", "device_kind", "scaling", "data", "sweep_id", "devices", "started_at")
FIELD_HEADERS = {"strategy": "strategy", "host": "host", "device_kind": "device", "scaling": "scaling",
                 "data": "data", "sweep_id": "sweep"}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_number(value, digits: int = 1) -> str:
    return "" if _missing(value) else f"{value:,.{digits}f}"


def fmt_ms(seconds) -> str:
    return "" if _missing(seconds) else f"{seconds * 1e3:,.2f}"


def fmt_share(value) -> str:
    return "" if _missing(value) else f"{value:.1%}"


def fmt_mib(nbytes) -> str:
    return "" if _missing(nbytes) else f"{nbytes / 2**20:,.0f}"


def fmt_efficiency(value) -> str:
    return "" if _missing(value) else f"{value:.2f}"


def fmt_accuracy(value) -> str:
    return "" if _missing(value) else f"{value:.4f}"


def _flag(value) -> bool:
    return not _missing(value) and bool(value)


def device_cell(row) -> str:
    if _missing(row.device_kind):
        return ""  # the run ended before it chose devices
    kind = str(row.device_kind)
    return f"{kind} (virtual)" if _flag(row.virtual) else kind


def remark(row, record: dict) -> str:
    """Why a run has no numbers, or what qualifies the numbers it has."""
    if row.status != "ok":
        return str(row.error or "")
    notes = []
    if _flag(row.oversubscribed):
        notes.append("oversubscribed: devices x threads > cores")
    if record.get("stopped_early"):
        notes.append(f"stopped early at step {record.get('steps_done')}")
    if _missing(row.scaling_efficiency):
        notes.append("no ok 1-device run to scale from")
    return "; ".join(notes)


def workload_table(frame: pd.DataFrame, records_by_id: dict[str, dict], workload: str
                   ) -> tuple[list[str], list[list[str]]]:
    """Columns and formatted rows for one workload. `frame` is the whole report's summary_frame, so every
    workload's table has the same columns telling runs apart (host, sweep, ...)."""
    rows = frame[frame.workload == workload].sort_values(list(SORT_KEYS), kind="stable", na_position="last")
    # The device and data columns are always there: a reader needs to know what N counts even with one
    # machine, and that an accuracy was measured on synthetic data, not on the dataset.
    fields = [f for f in varying_fields(frame) if f not in ("device_kind", "data")]
    metrics = sorted({m for m in rows.eval_metric.dropna()}) or ["accuracy"]
    unit = throughput_unit(workload)
    columns = ["backend", *(FIELD_HEADERS[f] for f in fields), "device", "N", "data", "status", unit,
               "scaling efficiency", "MFU", "MFU (measured peak)", "step p50 (ms)", "step p90 (ms)", "data wait",
               "peak memory (MiB)", "/".join(metrics), "reason / notes"]
    body = []
    for row in rows.itertuples():
        throughput = row.tokens_per_s if workload == "mlm" else row.samples_per_s
        body.append([row.backend, *(describe_field(f, getattr(row, f)) for f in fields), device_cell(row),
                     str(row.devices), describe_field("data", row.data), row.status, fmt_number(throughput),
                     fmt_efficiency(row.scaling_efficiency), fmt_share(row.mfu), fmt_share(row.mfu_achievable),
                     fmt_ms(row.step_time_p50), fmt_ms(row.step_time_p90), fmt_share(row.data_wait_fraction),
                     fmt_mib(row.peak_memory_bytes), fmt_accuracy(row.eval_value),
                     remark(row, records_by_id[row.run_id])])
    return columns, body
