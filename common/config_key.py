"""What makes two runs the same configuration, and the one definition of scaling efficiency built on it.

A run is a configuration key and a device count. The key holds everything that changes what a step computes
or how fast it can go, except the devices and what they alone decide (the data-parallel degree dp, and under
weak scaling the global batch): two runs with the same key at the same N are repeats; at N and at 1 device
they are one line of a figure, and the 1-device run is what the N-device run's scaling efficiency divides by.

Scaling efficiency = samples/s(N) / (N x samples/s of the reference run). The reference is the latest ok
1-device run of reference_key(key) in the same sweep: the same key with the layout's parallel dimensions
undone (tensor, pipeline and sharded state, as the layout table has always held them: one device training the
same global batch in the same micro-batches). Recompute stays, since it changes what every device computes.
Where no such run exists there is no efficiency, never a ratio to another configuration.

Records written before a field existed are read with RunConfig's defaults of the time (fp32, tiny, eager, no
accumulation), and a record without `mode` (written before it) keys on its strategy, whose dp count is masked.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, fields, replace

from common.config import RunConfig
from common.layout import OPTIONS, Layout

NO_REFERENCE = "no 1-device run of this configuration"
NO_SWEEP = ""  # the sweep of runs started by bench.run alone, outside bench.compare
_RUN_DEFAULTS = {f.name: f.default for f in fields(RunConfig)}
_DP_COUNT = re.compile(r"\b(fsdp|dp)\d+")


@dataclass(frozen=True)
class ConfigKey:
    workload: str
    backend: str
    mode: str                    # the backend's strategy or mode with the layout left out (Backend.mode_name)
    model_size: str
    precision: str
    scaling: str | None
    batch: int | None            # what stays fixed as N grows: per device under weak scaling, global under strong
    micro_batches: int           # accumulated per optimizer step: --grad-accum x the pipeline's --micro-batches
    layout: Layout               # dp left at 1; an option that needs a dimension the layout lacks at its default
    compile: str                 # "" eager, else the compile mode
    data: str | None
    device_kind: str | None
    host: str | None
    threads_per_device: int | None

    @property
    def id(self) -> str:
        """A short stable name of the key (summary.csv's config_key), the same in every process."""
        text = json.dumps([describe(self, f) for f in KEY_FIELDS])
        return hashlib.sha1(text.encode()).hexdigest()[:10]

    def without(self, *names: str) -> ConfigKey:
        """The key with these fields blanked: e.g. a baseline folder measured on another host."""
        return replace(self, **dict.fromkeys(names))


KEY_FIELDS = tuple(f.name for f in fields(ConfigKey))
FIELD_HEADERS = {"workload": "workload", "backend": "backend", "mode": "strategy/mode", "model_size": "model",
                 "precision": "precision", "scaling": "scaling", "batch": "batch", "micro_batches": "micro-batches",
                 "layout": "layout", "compile": "compile", "data": "data", "device_kind": "device", "host": "host",
                 "threads_per_device": "threads/device"}


def record_layout(record: dict) -> Layout:
    return Layout.from_record(record.get("layout") or {})


def _key_layout(layout: Layout) -> Layout:
    """The layout without what the devices decide (dp), and without options that mean nothing without the
    dimension they need (a schedule without a pipeline): they must not tell two configurations apart."""
    kept = {o.field: getattr(layout, o.field) for o in OPTIONS
            if not (o.needs and getattr(layout, o.needs) == 1)}
    if layout.sharded and layout.dp == 1:
        kept["fsdp"] = 2   # FSDP over every data rank, as many as the devices leave: 2 stands for any count
    return Layout(dp=1, **kept)


def _mode(record: dict) -> str:
    if record.get("mode") is not None:
        return record["mode"]
    return _DP_COUNT.sub(r"\1", record.get("strategy") or "")


def config_key(record: dict) -> ConfigKey:
    config = record.get("config") or {}
    scaling = record.get("scaling")
    layout = record_layout(record)
    return ConfigKey(
        workload=record["workload"], backend=record["backend"], mode=_mode(record),
        model_size=config.get("model_size") or _RUN_DEFAULTS["model_size"],
        precision=config.get("precision") or _RUN_DEFAULTS["precision"], scaling=scaling,
        batch=record.get("global_batch") if scaling == "strong" else record.get("per_device_batch"),
        micro_batches=layout.accumulation(config.get("grad_accum") or 1), layout=_key_layout(layout),
        compile=config.get("compile") or _RUN_DEFAULTS["compile"], data=record.get("data"),
        device_kind=record.get("device_kind"), host=(record.get("host") or {}).get("name"),
        threads_per_device=record.get("threads_per_device"))


def reference_key(key: ConfigKey) -> ConfigKey:
    """The key of the 1-device run a run of `key` is measured against (module docstring)."""
    return replace(key, layout=Layout(recompute=key.layout.recompute))


def sweep_of(record: dict) -> str:
    return record.get("sweep_id") or NO_SWEEP


def started(record: dict) -> tuple[str, str]:
    """The order in which 'latest' is meant: start time, then run id (a stamp with a random suffix)."""
    return record.get("started_at") or "", record.get("run_id") or ""


def latest_within_sweep(records: list[dict]) -> list[dict]:
    """The latest run of each (sweep, key, devices), whatever its status, in start order: within a sweep a
    rerun replaces a run; across sweeps every sweep keeps its own."""
    latest = {(sweep_of(r), config_key(r), r["devices"]): r for r in sorted(records, key=started)}
    return sorted(latest.values(), key=started)


def reference_throughputs(records: list[dict]) -> dict[str, float]:
    """run id -> samples/s of its reference run, for every ok run that has one in its sweep."""
    measured = sorted((r for r in records if r.get("status") == "ok" and r.get("samples_per_s")), key=started)
    one_device = {(sweep_of(r), config_key(r)): r["samples_per_s"] for r in measured if r["devices"] == 1}
    found = {}
    for r in measured:
        reference = one_device.get((sweep_of(r), reference_key(config_key(r))))
        if reference:
            found[r["run_id"]] = reference
    return found


def efficiency(samples_per_s: float, devices: int, reference_samples_per_s: float) -> float:
    return samples_per_s / (devices * reference_samples_per_s)


def scaling_efficiencies(records: list[dict]) -> dict[str, float]:
    """run id -> scaling efficiency, for every ok run whose reference run exists in its sweep."""
    by_id = {r["run_id"]: r for r in records}
    return {run_id: efficiency(by_id[run_id]["samples_per_s"], by_id[run_id]["devices"], reference)
            for run_id, reference in reference_throughputs(records).items()}


def layout_label(layout: Layout) -> str:
    """e.g. 'dp', 'fsdp', 'dp x tp2-vocab', 'dp x pp2-nmb4-1f1b': Layout.name with the dp count left out."""
    dims = ["fsdp" if layout.sharded and layout.dp == 1 else "dp"]
    dims += [f"{d}{getattr(layout, d)}" for d in ("fsdp", "tp", "pp", "cp")
             if getattr(layout, d) > 1 and not (d == "fsdp" and layout.dp == 1)]
    named = replace(layout, dp=2).name  # dp 2: a name with its options, never '1 device'
    options = named.split("-", 1)[1] if "-" in named else ""
    return " x ".join(dims) + (f"-{options}" if options else "")


def describe(key: ConfigKey, name: str) -> str:
    """A key field as a reader should see it in a table cell or a legend."""
    value = getattr(key, name)
    if name == "layout":
        return layout_label(value)
    if name == "batch":
        return "?" if value is None else f"{value} {'global' if key.scaling == 'strong' else 'per device'}"
    if name == "compile":
        return value or "eager"
    return "?" if value is None or value == "" else str(value)
