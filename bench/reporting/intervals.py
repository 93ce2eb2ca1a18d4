"""Rows measured more than once: their intervals, whether two rows differ, and a results folder against a baseline.

A row is one configuration key at one device count (common.config_key): its runs are the repeats of
`bench.compare --repeats`, and every ok run of it in the folder's other sweeps. Intervals come from
common.stats (a two-level bootstrap over the runs and their step times); a row's scaling efficiency is held
against the 1-device row of its reference key, its interval carrying the noise of both.
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from bench.reporting.layouts import layout_name
from common.config_key import ConfigKey, config_key, reference_key, sweep_of
from common.stats import Interval, Row, point_throughput, ratio_interval, throughput_interval, verdict

# The columns that name a row (its key and device count are in `key` and `devices`).
ROW_KEYS = ("workload", "backend", "strategy", "layout", "devices", "device_kind", "scaling", "global_batch",
            "precision", "model_size", "data")
# A baseline folder may come from another machine of the same kind: its rows match on the key less the host.
BASELINE_IGNORES = ("host",)
# A run started when more runnable processes than this many per core were waiting is marked busy, and so is
# one whose virtual machine had more than this share of its CPU time stolen.
BUSY_LOAD_PER_CORE = 1.5
BUSY_STEAL_SHARE = 0.05


def row_key(record: dict) -> tuple[ConfigKey, int]:
    """What makes two runs the same row: their configuration key and device count."""
    return config_key(record), record["devices"]


def _names(record: dict) -> dict:
    """The row's columns as a reader sees them."""
    key = config_key(record)
    return {"workload": key.workload, "backend": key.backend, "strategy": record.get("strategy"),
            "layout": layout_name(record) if record.get("layout") else "", "devices": record["devices"],
            "device_kind": key.device_kind, "scaling": key.scaling, "global_batch": record.get("global_batch"),
            "precision": key.precision, "model_size": key.model_size, "data": key.data}


def busy(record: dict) -> bool:
    """Whether the machine was busy with something else around the run (its `load` section)."""
    load, cores = record.get("load") or {}, (record.get("host") or {}).get("cores") or 1
    before = load.get("loadavg_1m_before")
    steal = load.get("cpu_steal_share")
    return bool((before is not None and before > BUSY_LOAD_PER_CORE * cores)
                or (steal is not None and steal > BUSY_STEAL_SHARE))


def _rows(records: list[dict], ignore: tuple[str, ...] = ()) -> dict[tuple, list[dict]]:
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("status") == "ok" and r.get("step_times_s") and r.get("global_batch"):
            key, devices = row_key(r)
            rows[key.without(*ignore), devices].append(r)
    return rows


def _measured(runs: list[dict]) -> Row:
    return [r["step_times_s"] for r in runs], runs[0]["global_batch"]


def interval_frame(records: list[dict]) -> pd.DataFrame:
    """One line per row: its runs (and the sweeps they came from), samples/s with its interval, and the scaling
    efficiency with its interval against the 1-device row of its reference key (weak scaling: N x the 1-device
    rate is ideal; strong: the same)."""
    rows = _rows(records)
    lines = []
    for (key, devices), runs in rows.items():
        speed = throughput_interval(*_measured(runs))
        one = rows.get((reference_key(key), 1))
        if devices == 1 and reference_key(key) == key:  # the reference itself: 1 by definition, not a ratio
            eff = Interval(1.0, 1.0, 1.0)
        else:
            eff = ratio_interval(_measured(runs), _measured(one), scale=1 / devices) if one else None
        lines.append({**_names(runs[-1]), "key": key, "runs": len(runs),
                      "sweeps": len({sweep_of(r) for r in runs}), "busy_runs": sum(busy(r) for r in runs),
                      "samples_per_s": speed.value, "samples_per_s_low": speed.low, "samples_per_s_high": speed.high,
                      "efficiency": eff.value if eff else None, "efficiency_low": eff.low if eff else None,
                      "efficiency_high": eff.high if eff else None})
    return pd.DataFrame(lines, columns=[*ROW_KEYS, "key", "runs", "sweeps", "busy_runs", "samples_per_s",
                                        "samples_per_s_low", "samples_per_s_high", "efficiency", "efficiency_low",
                                        "efficiency_high"])


def same_speed(a: pd.Series, b: pd.Series) -> bool:
    """Two rows whose samples/s intervals overlap are not ranked: the difference is inside the noise."""
    return Interval(a.samples_per_s, a.samples_per_s_low, a.samples_per_s_high).overlaps(
        Interval(b.samples_per_s, b.samples_per_s_low, b.samples_per_s_high))


def ranked(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows by workload, device count and speed, with `vs_fastest`: 'fastest', 'no difference' where a
    row's interval overlaps the fastest row's of its workload and device count, else its speed over it."""
    lines = []
    for _, group in frame.groupby(["workload", "devices"], sort=True):
        fastest = group.loc[group.samples_per_s.idxmax()]
        for _, row in group.sort_values("samples_per_s", ascending=False).iterrows():
            lines.append({**row.to_dict(), "vs_fastest": "fastest" if row.name == fastest.name else
                          "no difference" if same_speed(row, fastest) else
                          f"{row.samples_per_s / fastest.samples_per_s:.2f}x"})
    return pd.DataFrame(lines, columns=[*frame.columns, "vs_fastest"])


def baseline_frame(records: list[dict], baseline: list[dict], threshold: float = 0.0) -> pd.DataFrame:
    """The rows both folders measured: this folder's samples/s over the baseline's, the ratio's interval,
    and 'slower' / 'faster' only where the whole interval lies beyond 1 -/+ threshold."""
    mine, theirs = _rows(records, BASELINE_IGNORES), _rows(baseline, BASELINE_IGNORES)
    lines = []
    for key in sorted(set(mine) & set(theirs), key=str):
        ratio = ratio_interval(_measured(mine[key]), _measured(theirs[key]))
        lines.append({**_names(mine[key][-1]), "key": key[0], "runs": len(mine[key]),
                      "baseline_runs": len(theirs[key]),
                      "samples_per_s": point_throughput(*_measured(mine[key])),
                      "baseline_samples_per_s": point_throughput(*_measured(theirs[key])),
                      "ratio": ratio.value, "ratio_low": ratio.low, "ratio_high": ratio.high,
                      "verdict": verdict(ratio, threshold)})
    return pd.DataFrame(lines, columns=[*ROW_KEYS, "key", "runs", "baseline_runs", "samples_per_s",
                                        "baseline_samples_per_s", "ratio", "ratio_low", "ratio_high", "verdict"])
