"""Which runs share a line in a figure or a block in a table, and how each line is named and drawn.

A series is one group of GROUP_KEYS (sweep, host, backend, strategy, workload, data, device kind,
scaling): the same group summary_frame computes scaling efficiency in, so a plotted efficiency and
the ideal line always rest on the same 1-device run. Runs from different hosts or device kinds are
therefore never on one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from common.results import GROUP_KEYS

# Key fields a label may name, in label order.
LABEL_FIELDS = ("host", "device_kind", "strategy", "scaling", "data", "sweep_id")
DATA_NAMES = {"cnn": "MNIST", "mlm": "WikiText-2"}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
# One (marker, line style, hatch) per host and device kind, so a backend keeps its colour across machines.
MACHINE_STYLES = (("o", "-", ""), ("s", "--", "//"), ("^", ":", ".."), ("D", "-.", "xx"),
                  ("v", (0, (5, 1)), "\\\\"), ("P", (0, (1, 1)), "++"))


@dataclass
class Series:
    key: dict
    label: str
    color: str
    marker: str
    linestyle: str | tuple
    hatch: str
    runs: dict[int, dict] = field(default_factory=dict)        # devices -> latest ok record
    efficiency: dict[int, float] = field(default_factory=dict)  # devices -> summary_frame's value

    @property
    def machine(self) -> str:
        """Host and device kind: runs on different machines differ by orders of magnitude, so figures give each
        machine its own panel rather than one axis scaled for the fastest. Whether devices are virtual is no part
        of it: a 1-device run on a whole GPU anchors the virtual runs sharing that GPU, so they share a panel
        (virtual points are drawn hollow, see panel_title)."""
        kind = describe_field("device_kind", self.key["device_kind"])
        return f"{describe_field('host', self.key['host'])} · {kind}"

    @property
    def virtual_devices(self) -> list[int]:
        """Device counts whose run used virtual devices (slices of CPU cores, processes sharing a GPU)."""
        return [n for n in self.devices if self.runs[n].get("virtual")]

    @property
    def devices(self) -> list[int]:
        return sorted(self.runs)

    def throughput(self, devices: int) -> float:
        """tokens/s for mlm, samples/s otherwise: the unit a reader of that workload expects."""
        record = self.runs[devices]
        return record["tokens_per_s"] if record["workload"] == "mlm" else record["samples_per_s"]


def panel_title(machine: str, series: list[Series]) -> str:
    """The machine, and how its virtual devices are told apart: all virtual (virtual CPU devices), or some."""
    runs = [s.runs[n] for s in series for n in s.devices]
    virtual = [r for r in runs if r.get("virtual")]
    if virtual and len(virtual) == len(runs):
        return f"{machine} (virtual)"
    return f"{machine} (hollow markers: virtual devices)" if virtual else machine


def throughput_unit(workload: str) -> str:
    return "tokens/s" if workload == "mlm" else "samples/s"


def varying_fields(frame: pd.DataFrame) -> list[str]:
    """The key fields a label needs: host and device kind whenever the report holds more than one, the others
    only where they tell apart series that the backend and the fields already chosen do not."""
    fields: list[str] = []
    for name in LABEL_FIELDS:
        # A run that never started has no host detail or device kind: a missing value tells nothing apart.
        if name in ("host", "device_kind"):
            varies = frame[name].nunique() > 1
        else:
            varies = (frame.groupby(["backend", *fields], dropna=False)[name].nunique() > 1).any()
        if varies:
            fields.append(name)
    return fields


def describe_field(name: str, value) -> str:
    if name == "sweep_id":
        return str(value).removeprefix("sweep-") if value else "no sweep"
    return "?" if value is None or value != value else str(value)


def series_label(key: dict, fields: list[str]) -> str:
    return " · ".join([key["backend"], *(describe_field(f, key[f]) for f in fields)])


def build_series(records: list[dict], frame: pd.DataFrame) -> dict[str, list[Series]]:
    """Per workload, its series in a stable order, each holding the latest ok run at every device count.

    `frame` is summary_frame(records); it is sorted by start time, so the last ok row per device count wins,
    the same rule summary_frame uses for the 1-device baseline.
    """
    by_id = {r["run_id"]: r for r in records}
    # An ok run without measured steps (evaluation only) has no throughput to draw.
    ok = frame[(frame.status == "ok") & frame.samples_per_s.notna()]
    fields = varying_fields(ok)
    backends = list(dict.fromkeys(sorted(frame.backend)))
    machines = list(dict.fromkeys(sorted(zip(ok.host.fillna(""), ok.device_kind.fillna("")))))
    out: dict[str, list[Series]] = {}
    for values, group in ok.groupby(list(GROUP_KEYS), dropna=False, sort=True):
        key = dict(zip(GROUP_KEYS, values))
        machine = tuple("" if pd.isna(key[k]) else key[k] for k in ("host", "device_kind"))
        marker, linestyle, hatch = MACHINE_STYLES[machines.index(machine) % len(MACHINE_STYLES)]
        series = Series(key=key, label=series_label(key, fields),
                        color=COLORS[backends.index(key["backend"]) % len(COLORS)],
                        marker=marker, linestyle=linestyle, hatch=hatch)
        for row in group.itertuples():
            series.runs[row.devices] = by_id[row.run_id]
            series.efficiency[row.devices] = row.scaling_efficiency
        out.setdefault(key["workload"], []).append(series)
    for workload in out:
        out[workload].sort(key=lambda s: (s.key["backend"], s.label))
    return out
