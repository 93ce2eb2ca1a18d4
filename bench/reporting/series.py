"""Which runs share a line in a figure, and how each line is named and drawn.

A series is one configuration key (common.config_key) in one sweep: the key summary_frame computes
scaling efficiency with, so a plotted efficiency and the ideal line always rest on the same 1-device
run, and runs of different hosts, device kinds, model sizes, precisions, batches or layouts are never
on one line. Its legend label names the key fields that tell the lines apart (bench.reporting.keys).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from bench.reporting.keys import LABEL_FIELDS, cells, distinguishing, in_label, order, said_once
from common.config_key import ConfigKey, config_key, sweep_of
from common.spec import TOKEN_WORKLOADS

DATA_NAMES = {"cnn": "MNIST", "mlm": "WikiText-2", "lm": "WikiText-2"}
# matplotlib's tab10 and then tab20's lighter shades: one colour per configuration (machines aside).
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22", "#aec7e8", "#ff9896", "#98df8a", "#c5b0d5", "#ffbb78", "#c49c94")
# Fields of the machine a run ran on: a configuration keeps its colour across machines.
MACHINE_FIELDS = ("host", "device_kind", "threads_per_device")
# One (marker, line style, hatch) per host and device kind, so a backend keeps its colour across machines.
MACHINE_STYLES = (("o", "-", ""), ("s", "--", "//"), ("^", ":", ".."), ("D", "-.", "xx"),
                  ("v", (0, (5, 1)), "\\\\"), ("P", (0, (1, 1)), "++"))


@dataclass
class Series:
    key: ConfigKey
    sweep: str
    cells: dict[str, str]  # the key's fields as a reader sees them (bench.reporting.keys.cells)
    label: str
    color: str
    marker: str
    linestyle: str | tuple
    hatch: str
    runs: dict[int, dict] = field(default_factory=dict)        # devices -> latest ok record
    efficiency: dict[int, float] = field(default_factory=dict)  # devices -> summary_frame's value
    panel: str = ""  # the machine, and the model size where a workload has several (build_series)

    @property
    def machine(self) -> str:
        """Host and device kind: runs on different machines differ by orders of magnitude, so figures give each
        machine its own panel rather than one axis scaled for the fastest. Whether devices are virtual is no part
        of it: a 1-device run on a whole GPU anchors the virtual runs sharing that GPU, so they share a panel
        (virtual points are drawn hollow, see panel_title)."""
        return f"{self.cells['host']} · {self.cells['device_kind']}"

    @property
    def virtual_devices(self) -> list[int]:
        """Device counts whose run used virtual devices (slices of CPU cores, processes sharing a GPU)."""
        return [n for n in self.devices if self.runs[n].get("virtual")]

    @property
    def devices(self) -> list[int]:
        return sorted(self.runs)

    def throughput(self, devices: int) -> float:
        """tokens/s for the token workloads (mlm, lm), samples/s otherwise: the unit a reader of that workload
        expects."""
        record = self.runs[devices]
        return record["tokens_per_s"] if record["workload"] in TOKEN_WORKLOADS else record["samples_per_s"]


def panel_title(machine: str, series: list[Series]) -> str:
    """The machine, and how its virtual devices are told apart: all virtual (virtual CPU devices), or some."""
    runs = [s.runs[n] for s in series for n in s.devices]
    virtual = [r for r in runs if r.get("virtual")]
    if virtual and len(virtual) == len(runs):
        return f"{machine} (virtual)"
    return f"{machine} (hollow markers: virtual devices)" if virtual else machine


def throughput_unit(workload: str) -> str:
    return "tokens/s" if workload in TOKEN_WORKLOADS else "samples/s"


def series_label(cells: dict[str, str], fields: list[str]) -> str:
    return " · ".join([cells["backend"], *(in_label(f, cells[f]) for f in fields)])


def describe_lines(series: list[Series]) -> str:
    """What the lines of a figure share, said once (the legend names what tells them apart)."""
    rows = [s.cells for s in series]
    return said_once(rows, distinguishing(rows), [f for f in LABEL_FIELDS if f != "data"], what="line")


def build_series(records: list[dict], frame: pd.DataFrame) -> dict[str, list[Series]]:
    """Per workload, its series in a stable order, each holding the latest ok run at every device count.

    `frame` is summary_frame(records); it is sorted by start time, so the last ok row per device count wins,
    the same rule summary_frame uses for the 1-device baseline.
    """
    by_id = {r["run_id"]: r for r in records}
    # An ok run without measured steps (evaluation only) has no throughput to draw.
    ok = frame[(frame.status == "ok") & frame.samples_per_s.notna()]
    out: dict[str, list[Series]] = {}
    for row in ok.itertuples():
        record = by_id[row.run_id]
        key, sweep = config_key(record), sweep_of(record)
        mine = out.setdefault(key.workload, [])
        series = next((s for s in mine if (s.key, s.sweep) == (key, sweep)), None)
        if series is None:
            series = Series(key=key, sweep=sweep, cells=cells(record), label="", color="", marker="",
                            linestyle="", hatch="")
            mine.append(series)
        series.runs[row.devices] = record
        series.efficiency[row.devices] = row.scaling_efficiency
    for series in out.values():
        _name_and_style(series)
    return out


def _name_and_style(series: list[Series]) -> None:
    """Labels from the fields that tell a workload's lines apart; a colour per configuration, a marker and line
    style per machine; a panel per machine and, where the workload has several, per model size: the throughput
    of a tiny and a base model never share an axis."""
    rows = [s.cells for s in series]
    fields = distinguishing(rows)
    for s in series:
        s.label = series_label(s.cells, fields)
    series.sort(key=lambda s: order(s.cells))
    machines = sorted({(s.cells["host"], s.cells["device_kind"]) for s in series})
    identities = list(dict.fromkeys(s.key.without(*MACHINE_FIELDS) for s in series))
    sizes = {s.key.model_size for s in series}
    for s in series:
        machine = machines.index((s.cells["host"], s.cells["device_kind"]))
        s.marker, s.linestyle, s.hatch = MACHINE_STYLES[machine % len(MACHINE_STYLES)]
        s.color = COLORS[identities.index(s.key.without(*MACHINE_FIELDS)) % len(COLORS)]
        s.panel = s.machine + (f" · model {s.key.model_size}" if len(sizes) > 1 else "")
