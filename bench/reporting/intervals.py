"""Rows measured more than once: their intervals, whether two rows differ, and a results folder against a baseline.

A row is one configuration (ROW_KEYS): its runs are the repeats of `bench.compare --repeats`, or every
ok run of that configuration in a folder. Intervals come from common.stats (a two-level bootstrap over
the runs and their step times); a row's scaling efficiency is held against the 1-device row of the same
configuration, its interval carrying the noise of both.
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from bench.reporting.layouts import layout_name
from common.stats import Interval, Row, point_throughput, ratio_interval, throughput_interval, verdict

# What makes two runs the same row: repeats of it, or the same row in another folder.
ROW_KEYS = ("workload", "backend", "strategy", "layout", "devices", "device_kind", "scaling", "global_batch",
            "precision", "model_size", "data")
# A run started when more runnable processes than this many per core were waiting is marked busy, and so is
# one whose virtual machine had more than this share of its CPU time stolen.
BUSY_LOAD_PER_CORE = 1.5
BUSY_STEAL_SHARE = 0.05


def row_key(record: dict) -> tuple:
    config = record.get("config") or {}
    fields = {"workload": record["workload"], "backend": record["backend"], "strategy": record.get("strategy"),
              "layout": layout_name(record) if record.get("layout") else "", "devices": record["devices"],
              "device_kind": record.get("device_kind"), "scaling": record.get("scaling"),
              "global_batch": record.get("global_batch"), "precision": config.get("precision"),
              "model_size": config.get("model_size"), "data": record.get("data")}
    return tuple(fields[k] for k in ROW_KEYS)


def busy(record: dict) -> bool:
    """Whether the machine was busy with something else around the run (its `load` section)."""
    load, cores = record.get("load") or {}, (record.get("host") or {}).get("cores") or 1
    before = load.get("loadavg_1m_before")
    steal = load.get("cpu_steal_share")
    return bool((before is not None and before > BUSY_LOAD_PER_CORE * cores)
                or (steal is not None and steal > BUSY_STEAL_SHARE))


def _rows(records: list[dict]) -> dict[tuple, list[dict]]:
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("status") == "ok" and r.get("step_times_s") and r.get("global_batch"):
            rows[row_key(r)].append(r)
    return rows


def _measured(runs: list[dict]) -> Row:
    return [r["step_times_s"] for r in runs], runs[0]["global_batch"]


def _one_device(key: tuple) -> tuple:
    """The row a row's scaling is held against: one device, of the same global batch under strong scaling
    and of one device's share of it under weak scaling."""
    fields = dict(zip(ROW_KEYS, key))
    batch = fields["global_batch"] // fields["devices"] if fields["scaling"] == "weak" else fields["global_batch"]
    one = {**fields, "devices": 1, "global_batch": batch, "layout": "1 device" if fields["layout"] else ""}
    return tuple(one[k] for k in ROW_KEYS)


def interval_frame(records: list[dict]) -> pd.DataFrame:
    """One line per row: its runs, samples/s with its interval, and the scaling efficiency with its interval
    against the 1-device row (weak scaling: N x the 1-device rate is ideal; strong: the same)."""
    rows = _rows(records)
    lines = []
    for key, runs in rows.items():
        speed = throughput_interval(*_measured(runs))
        fields = dict(zip(ROW_KEYS, key))
        one = rows.get(_one_device(key))
        if fields["devices"] == 1:  # the reference itself: 1 by definition, not a ratio of two noisy draws
            eff = Interval(1.0, 1.0, 1.0)
        else:
            eff = ratio_interval(_measured(runs), _measured(one), scale=1 / fields["devices"]) if one else None
        lines.append({**fields, "runs": len(runs), "busy_runs": sum(busy(r) for r in runs),
                      "samples_per_s": speed.value, "samples_per_s_low": speed.low, "samples_per_s_high": speed.high,
                      "efficiency": eff.value if eff else None, "efficiency_low": eff.low if eff else None,
                      "efficiency_high": eff.high if eff else None})
    return pd.DataFrame(lines, columns=[*ROW_KEYS, "runs", "busy_runs", "samples_per_s", "samples_per_s_low",
                                        "samples_per_s_high", "efficiency", "efficiency_low", "efficiency_high"])


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
    mine, theirs = _rows(records), _rows(baseline)
    lines = []
    for key in sorted(set(mine) & set(theirs), key=str):
        ratio = ratio_interval(_measured(mine[key]), _measured(theirs[key]))
        lines.append({**dict(zip(ROW_KEYS, key)), "runs": len(mine[key]), "baseline_runs": len(theirs[key]),
                      "samples_per_s": point_throughput(*_measured(mine[key])),
                      "baseline_samples_per_s": point_throughput(*_measured(theirs[key])),
                      "ratio": ratio.value, "ratio_low": ratio.low, "ratio_high": ratio.high,
                      "verdict": verdict(ratio, threshold)})
    return pd.DataFrame(lines, columns=[*ROW_KEYS, "runs", "baseline_runs", "samples_per_s",
                                        "baseline_samples_per_s", "ratio", "ratio_low", "ratio_high", "verdict"])
