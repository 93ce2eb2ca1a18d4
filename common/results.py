"""The result record of CONVENTIONS §4: its fields, atomic writing, and the sweep summary."""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from common.config_key import config_key, describe, scaling_efficiencies
from common.sections import record_section_problems, section_problems
from common.spec import TOKEN_WORKLOADS

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1
RUN_RECORDS = "runs"              # one record per run: what summaries and reports read
NODE_RECORDS = "node-records"     # the same record as seen by node R > 0 of a several-host run
# invalid: a sweep's run that bench.run refuses as bad input at its device count (e.g. a global batch
# that does not divide), recorded by bench.compare: a configuration error, not a machine limit.
STATUSES = ("ok", "failed", "unsupported", "invalid")

REQUIRED_FIELDS = (
    "schema_version", "run_id", "status", "error", "backend", "strategy", "framework",
    "framework_version", "workload", "devices", "device_kind", "virtual", "threads_per_device",
    "scaling", "per_device_batch", "global_batch", "warmup_steps", "measured_steps", "step_time_s",
    "samples_per_s", "tokens_per_s", "data_wait_fraction", "params", "flops_per_sample",
    "achieved_flops", "peak_memory_bytes", "loss", "eval", "seed", "config", "host", "versions",
    "git_sha", "started_at", "duration_s", "notes", "scheduler",
)
# The record's `scheduler`: the job the run ran in (common.scheduler), null outside a scheduler. `nodes` is the
# job step's node names in node-rank order (nodes.hosts says which ranks ran on which); `step_id` is null in a
# batch script's own step.
SCHEDULER_FIELDS = ("name", "job_id", "step_id", "nodes", "restart_count")
STEP_TIME_KEYS = ("mean", "p50", "p90", "min", "max", "std")

# The columns of summary.csv, in order. config_key names the run's configuration (common.config_key), whose
# fields follow it as a reader sees them; scaling_efficiency is against the reference run of that key.
KEY_COLUMNS = ("mode", "model_size", "precision", "micro_batches", "layout", "compile")
SUMMARY_COLUMNS = (
    "run_id", "sweep_id", "config_key", "status", "backend", "strategy", *KEY_COLUMNS, "workload", "data",
    "devices", "device_kind", "virtual", "threads_per_device", "oversubscribed", "scaling", "per_device_batch",
    "global_batch", "measured_steps", "samples_per_s", "tokens_per_s", "scaling_efficiency", "mfu",
    "mfu_achievable", "step_time_p50", "step_time_p90", "data_wait_fraction", "peak_memory_bytes", "eval_metric",
    "eval_value", "loss_last", "host", "started_at", "error",
)


def new_run_id(backend: str, workload: str, devices: int, scheduler_tag: str = "") -> str:
    """A time stamp and a random suffix; in a scheduler's job step, whose nodes must name the run alike without
    talking to each other, the step's tag (common.scheduler) instead."""
    if scheduler_tag:
        return f"{scheduler_tag}-{backend}-{workload}-n{devices}"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{backend}-{workload}-n{devices}-{secrets.token_hex(3)}"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def validate_record(record: dict) -> list[str]:
    """Problems with a record's shape; empty when it is well-formed."""
    problems = [f"missing field {k}" for k in REQUIRED_FIELDS if k not in record]
    if record.get("status") not in STATUSES:
        problems.append(f"status {record.get('status')!r} not in {STATUSES}")
    if record.get("status") == "ok":
        measured = ("samples_per_s", "measured_steps") if record.get("measured_steps") else ()
        for key in ("params", "flops_per_sample", *measured):
            if not isinstance(record.get(key), (int, float)) or record[key] <= 0:
                problems.append(f"ok record with {key}={record.get(key)!r}")
        if measured:
            st = record.get("step_time_s") or {}
            problems += [f"step_time_s lacks {k}" for k in STEP_TIME_KEYS if k not in st]
            if record.get("workload") in TOKEN_WORKLOADS and not record.get("tokens_per_s"):
                problems.append(f"{record['workload']} record without tokens_per_s")
    elif not record.get("error"):
        problems.append(f"{record.get('status')} record without an error")
    scheduler = record.get("scheduler")
    if scheduler is not None and (not isinstance(scheduler, dict) or set(scheduler) != set(SCHEDULER_FIELDS)):
        problems.append(f"scheduler {scheduler!r} is not an object with exactly {', '.join(SCHEDULER_FIELDS)}")
    problems += record_section_problems(record)
    mfu = record.get("mfu_achievable")
    if mfu is not None and (isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or mfu < 0):
        problems.append(f"mfu_achievable {mfu!r} is not a non-negative number")
    if isinstance(record.get("backend_metrics"), dict):
        problems += section_problems(record["backend_metrics"])
    return problems


def write_atomic(path: Path, payload: bytes) -> Path:
    """Write to a temp file in the same folder, fsync, then rename: readers never see half a file. Mode
    0644 like any file the user writes (mkstemp makes 0600): records, summaries and reports are shared."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, payload: dict) -> Path:
    return write_atomic(path, (json.dumps(payload, indent=1, sort_keys=True, allow_nan=False) + "\n").encode())


def write_record(record: dict, out_dir: Path, folder: str = RUN_RECORDS) -> Path:
    problems = validate_record(record)
    if problems:
        raise ValueError(f"refusing to write a malformed record: {'; '.join(problems)}")
    return write_json_atomic(Path(out_dir) / folder / f"{record['run_id']}.json", record)


def load_records(out_dir: Path, folder: str = RUN_RECORDS) -> list[dict]:
    records = []
    for path in sorted((Path(out_dir) / folder).glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # JSONDecodeError, and UnicodeDecodeError for a binary file
            continue  # a foreign or damaged file must not hide the other runs
    return records


def _row(r: dict) -> dict:
    st = r.get("step_time_s") or {}
    ev = r.get("eval") or {}
    key = config_key(r)
    return {
        "run_id": r["run_id"], "sweep_id": r.get("sweep_id") or "", "config_key": key.id, "status": r["status"],
        **{name: describe(key, name) for name in KEY_COLUMNS},
        "backend": r["backend"], "strategy": r.get("strategy"), "workload": r["workload"],
        "data": r.get("data"), "devices": r["devices"], "device_kind": r.get("device_kind"),
        "virtual": r.get("virtual"), "threads_per_device": r.get("threads_per_device"),
        "oversubscribed": r.get("oversubscribed"), "scaling": r.get("scaling"),
        "per_device_batch": r.get("per_device_batch"), "global_batch": r.get("global_batch"),
        "measured_steps": r.get("measured_steps"), "samples_per_s": r.get("samples_per_s"),
        "tokens_per_s": r.get("tokens_per_s"), "mfu": r.get("mfu"), "mfu_achievable": r.get("mfu_achievable"),
        "step_time_p50": st.get("p50"),
        "step_time_p90": st.get("p90"),
        "data_wait_fraction": r.get("data_wait_fraction"), "peak_memory_bytes": r.get("peak_memory_bytes"),
        "eval_metric": ev.get("metric"), "eval_value": ev.get("value"),
        "loss_last": (r.get("loss") or {}).get("last"), "host": (r.get("host") or {}).get("name"),
        "started_at": r.get("started_at"), "error": r.get("error"),
    }


def summary_frame(records: list[dict]) -> pd.DataFrame:
    """One row per run; scaling_efficiency = sps(N) / (N * sps(1)) against the latest ok 1-device run of
    the run's reference configuration in its sweep (common.config_key), empty where the sweep has none."""
    # Imported here, not with the module: bench.run and every worker import this module for its records, and
    # pandas was the larger part of their start-up (~0.3 s of CPU, in each of the suite's hundreds of processes).
    import pandas as pd

    frame = pd.DataFrame([_row(r) for r in records], columns=[c for c in SUMMARY_COLUMNS
                                                              if c != "scaling_efficiency"])
    frame["scaling_efficiency"] = frame.run_id.map(scaling_efficiencies(records)).astype(float)
    frame = frame.sort_values(["started_at", "run_id"], kind="stable").reset_index(drop=True)
    return frame[list(SUMMARY_COLUMNS)]


def write_summary(out_dir: Path, records: list[dict] | None = None) -> Path:
    """summary.csv from every record in out_dir (or `records`). Two sweeps sharing out_dir take turns
    under a lock, so the last to write has read every record written before it: without it, a sweep
    that read the records just before the other one's last record landed could overwrite the
    complete table with its older one."""
    path = Path(out_dir) / "summary.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".summary.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        frame = summary_frame(load_records(out_dir) if records is None else records)
        write_atomic(path, frame.to_csv(index=False).encode())
    return path
