"""The layout figure: throughput and memory per device, one bar per layout (the layout table's ok runs).

Left, samples/s of all devices, with a tick at N x the 1-device reference (ideal strong scaling). Right, the
peak memory of the most loaded device, each rank's peak as a dot, and the parameters + gradients + optimizer
state the most loaded rank holds: the memory a layout exists to save.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.reporting.layouts import mib
from bench.reporting.plots import Plot
from common.sections import StateBytesPerRank

BAR_COLOR, STATE_COLOR, RANK_COLOR = "#1f77b4", "#ff7f0e", "black"


def _labels(ok: pd.DataFrame) -> list[str]:
    """The layout name, plus whatever else tells two bars apart (backend, host, global batch)."""
    extra = [c for c in ("backend", "host", "global_batch") if ok[c].nunique(dropna=False) > 1]
    return [" · ".join([row.layout, *(_told_apart_by(row, c) for c in extra)]) for row in ok.itertuples()]


def _told_apart_by(row, column: str) -> str:
    if column == "global_batch":
        return f"batch {row.global_batch}"
    if column == "host" and pd.isna(row.host):
        return "host unknown"  # a record without a host (the frame holds it as a missing value, printed "nan")
    return str(getattr(row, column))


def layout_plot(workload: str, frame: pd.DataFrame, records_by_id: dict[str, dict], caption: str) -> Plot:
    """`frame`: layout_frame's rows; the latest ok run of each bar is drawn."""
    ok = frame[(frame.workload == workload) & (frame.status == "ok") & frame.samples_per_s.notna()]
    ok = ok.assign(label=_labels(ok)).sort_values("started_at", kind="stable").drop_duplicates("label", keep="last")
    ok = ok.sort_values(["devices", "layout"], kind="stable")
    labels = list(ok.label)
    fig = Figure(figsize=(min(max(8.0, 1.6 * len(labels)), 16), 5.2), layout="constrained")
    speed, memory = fig.subplots(1, 2)
    fig.suptitle(f"{workload}: throughput and memory per device by layout")
    x = range(len(labels))
    data: dict[str, list] = {"samples/s": list(zip(labels, ok.samples_per_s))}
    speed.bar(x, ok.samples_per_s, color=BAR_COLOR, label="samples/s, all devices")
    ideal = [(label, n * ref) for label, n, ref in zip(labels, ok.devices, ok.reference_samples_per_s) if ref == ref]
    if ideal:
        xs = [labels.index(label) for label, _ in ideal]
        speed.scatter(xs, [v for _, v in ideal], marker="_", s=900, color="grey", label="N x 1-device run",
                      zorder=3)
        data["ideal samples/s"] = ideal
    speed.set_ylabel("samples/s, all devices")
    speed.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))

    peaks, states = [], []
    for label, run_id in zip(labels, ok.run_id):
        r = records_by_id[run_id]
        per_rank = r.get("peak_memory_per_rank") or ([r["peak_memory_bytes"]] if r.get("peak_memory_bytes") else [])
        peaks.append((label, [mib(v) for v in per_rank]))
        state = StateBytesPerRank.from_metrics(r.get("backend_metrics"))
        states.append((label, max((mib(rank.total) for rank in (state.ranks if state else [])),
                                  default=None)))
    width = 0.4
    tops = [max(v) if v else 0.0 for _, v in peaks]
    memory.bar([i - width / 2 for i in x], tops, width=width, color=BAR_COLOR, label="peak, most loaded device")
    for i, (_, per_rank) in enumerate(peaks):
        memory.scatter([i - width / 2] * len(per_rank), per_rank, color=RANK_COLOR, s=10, zorder=3,
                       label="peak, each rank" if i == 0 else None)
    held = [(i, v) for i, (_, v) in enumerate(states) if v is not None]
    if held:
        memory.bar([i + width / 2 for i, _ in held], [v for _, v in held], width=width, color=STATE_COLOR,
                   label="params + grads + optimizer, most loaded rank")
    data["peak memory max (MiB)"] = [(label, top) for (label, _), top in zip(peaks, tops)]
    data["peak memory per rank (MiB)"] = peaks
    data["params+grads+optimizer max (MiB)"] = [(labels[i], v) for i, v in held]
    memory.set_ylabel("MiB per device")
    handles = {}
    for ax in (speed, memory):
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
        handles.update({label: h for h, label in zip(*ax.get_legend_handles_labels())})
    # Below the panels, where it hides no bar.
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize="small", ncols=3)
    return Plot(f"{workload}-layouts", f"{workload}: layouts", caption, fig, data)
