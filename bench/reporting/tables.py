"""Per workload, the table configuration x devices: the latest run of each configuration key and device count
in each sweep, failed and unsupported ones with their reason. The key's fields that tell its rows apart are
columns; the others are said once above it (bench.reporting.keys)."""
from __future__ import annotations

import math
from collections import Counter

import pandas as pd

from bench.reporting.keys import HEADERS, LABEL_FIELDS, cells, distinguishing, order, said_once
from bench.reporting.series import throughput_unit
from common.config_key import NO_REFERENCE, config_key, latest_within_sweep, reference_key, sweep_of
from common.spec import TOKEN_WORKLOADS

# The device and data columns are always there: a reader needs to know what N counts even with one machine,
# and that an accuracy was measured on synthetic data, not on the dataset.
ALWAYS = ("device_kind", "data")


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


def remark(row, record: dict, runs_in_sweep: int, sweeps: int, timed_runs: int) -> str:
    """Why a run has no numbers, or what qualifies the numbers it has."""
    if row.status != "ok":
        return str(row.error or "")
    notes = []
    if _flag(row.oversubscribed):
        notes.append("oversubscribed: devices x threads > cores")
    if record.get("stopped_early"):
        notes.append(f"stopped early at step {record.get('steps_done')}")
    if runs_in_sweep > 1:
        notes.append(f"the latest of {runs_in_sweep} runs of this configuration in its sweep")
    if sweeps > 1:
        spread = "; its spread over them: Repeated rows" if timed_runs > 1 else ""
        notes.append(f"measured in {sweeps} sweeps, a row each{spread}")
    return "; ".join(notes)


def efficiency_cell(row, one_device_elsewhere: bool) -> str:
    """The efficiency, or for an ok run without a 1-device run of its configuration in its sweep, why not."""
    if row.status != "ok" or not _missing(row.scaling_efficiency):
        return fmt_efficiency(row.scaling_efficiency)
    return NO_REFERENCE + (" in its sweep" if one_device_elsewhere else "")


def workload_table(frame: pd.DataFrame, records_by_id: dict[str, dict], workload: str
                   ) -> tuple[str, list[str], list[list[str]]]:
    """The sentence above one workload's table (what its rows share), its columns and formatted rows. `frame`
    is the report's summary_frame; the table keeps the latest run of each key and device count per sweep."""
    mine = [records_by_id[i] for i in frame.run_id[frame.workload == workload]]
    latest = {r["run_id"] for r in latest_within_sweep(mine)}
    runs_in_sweep = Counter((sweep_of(r), config_key(r), r["devices"]) for r in mine)
    sweeps_of_row = {}
    for r in mine:
        sweeps_of_row.setdefault((config_key(r), r["devices"]), set()).add(sweep_of(r))
    # The runs the Repeated rows section bootstraps (bench.reporting.intervals): ok, with their step times.
    timed = Counter((config_key(r), r["devices"]) for r in mine if r["status"] == "ok" and r.get("step_times_s"))
    one_device = {config_key(r) for r in mine if r["status"] == "ok" and r["devices"] == 1}
    rows = frame[frame.run_id.isin(latest)]
    described = {run_id: cells(records_by_id[run_id]) for run_id in rows.run_id}
    rows = rows.assign(_order=[order(described[i]) for i in rows.run_id])
    rows = rows.sort_values(["_order", "devices", "started_at"], kind="stable")
    shown = distinguishing(list(described.values()))
    fields = [f for f in shown if f not in ALWAYS]
    above = said_once(list(described.values()), shown, [f for f in LABEL_FIELDS if f not in ALWAYS])
    metrics = sorted({m for m in rows.eval_metric.dropna()}) or ["accuracy"]
    unit = throughput_unit(workload)
    columns = ["backend", *(HEADERS[f] for f in fields), "device", "N", "data", "status", unit,
               "scaling efficiency", "MFU", "MFU (measured peak)", "step p50 (ms)", "step p90 (ms)", "data wait",
               "peak memory (MiB)", "/".join(metrics), "reason / notes"]
    body = []
    for row in rows.itertuples():
        record, key = records_by_id[row.run_id], config_key(records_by_id[row.run_id])
        throughput = row.tokens_per_s if workload in TOKEN_WORKLOADS else row.samples_per_s
        body.append([row.backend, *(described[row.run_id][f] for f in fields), device_cell(row),
                     str(row.devices), described[row.run_id]["data"], row.status, fmt_number(throughput),
                     efficiency_cell(row, reference_key(key) in one_device), fmt_share(row.mfu),
                     fmt_share(row.mfu_achievable),
                     fmt_ms(row.step_time_p50), fmt_ms(row.step_time_p90), fmt_share(row.data_wait_fraction),
                     fmt_mib(row.peak_memory_bytes), fmt_accuracy(row.eval_value),
                     remark(row, record, runs_in_sweep[sweep_of(record), key, row.devices],
                            len(sweeps_of_row[key, row.devices]), timed[key, row.devices])])
    return above, columns, body
