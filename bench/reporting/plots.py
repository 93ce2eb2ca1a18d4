"""The report's figures, drawn with matplotlib's object API (no pyplot state, Agg canvas).

Every function returns a Plot whose `data` maps each drawn line's label to the points it drew, so the
tests can hold the pictures to the records. Throughput, step time and time to accuracy get one panel per
machine (host and device kind), since a GPU and a virtual CPU device differ by orders of magnitude, and per
model size where a workload has several (Series.panel); loss gets one row per model size; efficiency is a
ratio, comparable across machines and models, and shares an axis. Where no line has more than one device,
throughput is a bar per configuration and there is no efficiency figure: nothing scaled.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from bench.reporting.series import Series, panel_title, throughput_unit

DPI = 110
IDEAL_STYLE = {"linestyle": (0, (2, 2)), "linewidth": 1, "alpha": 0.7}
# A ring around a point measured with more threads than cores: its loss is the machine's, not the backend's.
OVERSUBSCRIBED_STYLE = {"marker": "o", "markersize": 20, "markerfacecolor": "none", "markeredgecolor": "black",
                        "markeredgewidth": 1.2, "linestyle": "none"}
OVERSUBSCRIBED_LABEL = "oversubscribed: devices x threads > cores"


@dataclass
class Plot:
    slug: str
    title: str
    caption: str
    figure: Figure
    data: dict[str, list]
    absent: list[str] = field(default_factory=list)  # series with nothing to draw, named in the figure

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=DPI)
        return buffer.getvalue()


def _log2_devices_axis(ax, devices: list[int]) -> None:
    """Device counts on a log2 axis, ticked at the counts that ran and written as integers."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(devices))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(devices) / 1.3, max(devices) * 1.3)
    ax.set_xlabel("devices (N)")


def _all_devices(series: list[Series]) -> list[int]:
    return sorted({n for s in series for n in s.devices})


def _grid(title: str, rows: list[str], columns: list, sharey: bool | str = False):
    """A figure of panels, rows x columns, keyed (row, column), with room for one legend below."""
    fig = Figure(figsize=(min(max(7.5, 4.6 * len(columns)), 14), 0.8 + 3.6 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), len(columns), squeeze=False, sharey=sharey)
    fig.suptitle(title)
    return fig, {(r, c): axes[i][j] for i, r in enumerate(rows) for j, c in enumerate(columns)}


def _panels(series: list[Series]) -> list[str]:
    return sorted(dict.fromkeys(s.panel for s in series))


def _legend_below(fig, handles: dict) -> None:
    """One legend under all panels, each series once, so it hides no panel's lines."""
    if handles:
        # As many columns as the longest label leaves room for (about 6 pixels a character at this size).
        room = int(fig.get_figwidth() * DPI // (6 * max(len(label) for label in handles) + 50))
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize="small",
                   ncols=max(1, min(3, len(handles), room)))


def _title(panel: str, series: list[Series], names: list[str]) -> str:
    """The panel's machine (and model size) where there are several; always a word when some of its devices
    are virtual."""
    title = panel_title(panel, [s for s in series if s.panel == panel])
    return title if len(names) > 1 or title != panel else ""


def _hollow_virtual(ax, s: Series, points: list[tuple]) -> None:
    """Virtual-device points drawn again, hollow, over the series' line (label "_...": no legend entry)."""
    if points:
        ax.plot(*zip(*points), linestyle="none", marker=s.marker, markersize=9, markerfacecolor="white",
                markeredgecolor=s.color, label=f"_virtual: {s.label}")


def _series_handle(s: Series) -> Line2D:
    return Line2D([], [], color=s.color, marker=s.marker, linestyle=s.linestyle)


def _overlap_style(index: int, count: int) -> dict:
    """Curves that coincide (the backends at one N should) must all stay visible: the first drawn is the
    widest and the later ones narrower on top of it (opaque), so each colour shows as a band at the edges."""
    wider = count - 1 - index
    # At most 6 points wider (10 for markers) however many curves: the bands narrow, the widest stays a line.
    step = min(1.8, 6 / max(1, count - 1)), min(3.0, 10 / max(1, count - 1))
    return {"linewidth": 1.2 + step[0] * wider, "markersize": 5 + step[1] * wider, "zorder": 2 + index}


def _mark_oversubscribed(ax, s: Series, points: list[tuple], handles: dict) -> None:
    rings = [(n, y) for n, y in points if s.runs[n].get("oversubscribed")]
    if rings:
        ax.plot(*zip(*rings), label="_oversubscribed", **OVERSUBSCRIBED_STYLE)
        handles[OVERSUBSCRIBED_LABEL] = Line2D([], [], **OVERSUBSCRIBED_STYLE)


def mark_absent(plot: Plot, absent: list[str]) -> Plot:
    """Name in the figure what has no line in it (a backend whose runs all failed or were unsupported),
    so that a missing curve does not read as one that was never asked for."""
    if absent:
        plot.absent = list(absent)
        plot.figure.suptitle(f"{plot.figure.get_suptitle()}\nnot drawn, no ok run: {'; '.join(absent)}")
    return plot


def _scaled(series: list[Series]) -> bool:
    return any(len(s.devices) > 1 or s.devices != [1] for s in series)


def one_device_throughput_plot(workload: str, series: list[Series], caption: str) -> Plot:
    """Every line a single 1-device point: a bar per configuration, read off a linear axis from zero, one
    panel per machine and model size, rather than a stack of dots at N = 1."""
    unit, names = throughput_unit(workload), _panels(series)
    counts = [sum(s.panel == name for s in series) for name in names]
    fig = Figure(figsize=(11, 1.0 + sum(0.42 * c + 0.9 for c in counts)), layout="constrained")
    axes = fig.subplots(len(names), 1, squeeze=False, height_ratios=[c + 1.5 for c in counts])[:, 0]
    fig.suptitle(f"{workload}: throughput on one device, by configuration")
    data = {}
    for ax, name in zip(axes, names):
        mine = [s for s in series if s.panel == name]
        values = [s.throughput(1) for s in mine]
        ax.barh(range(len(mine)), values, color=[s.color for s in mine], hatch=[s.hatch for s in mine])
        for y, value in enumerate(values):
            ax.annotate(f" {value:,.0f}", (value, y), va="center", fontsize="small")
        ax.set_yticks(range(len(mine)), [s.label for s in mine], fontsize="small")
        ax.invert_yaxis()  # the first configuration on top, as in the table
        ax.set_xlim(0, max(values) * 1.18)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel(f"{unit}, 1 device")
        ax.set_title(_title(name, series, names))
        ax.grid(True, axis="x", alpha=0.3)
        data.update({s.label: [(1, v)] for s, v in zip(mine, values)})
    return Plot(f"{workload}-throughput", f"{workload}: throughput", caption, fig, data)


def throughput_plot(workload: str, series: list[Series], caption: str) -> Plot:
    if not _scaled(series):
        return one_device_throughput_plot(workload, series, caption)
    unit = throughput_unit(workload)
    names = _panels(series)
    fig, panels = _grid(f"{workload}: throughput against devices", [""], names)
    data, handles = {}, {}
    for s in series:
        ax = panels["", s.panel]
        points = [(n, s.throughput(n)) for n in s.devices]
        mine = [t for t in series if t.panel == s.panel]
        ax.plot(*zip(*points), color=s.color, marker=s.marker, linestyle=s.linestyle, label=s.label,
                **_overlap_style(mine.index(s), len(mine)))
        _hollow_virtual(ax, s, [(n, s.throughput(n)) for n in s.virtual_devices])
        data[s.label] = points
        handles[s.label] = _series_handle(s)
        _mark_oversubscribed(ax, s, points, handles)
        if 1 in s.runs:
            ideal = [(n, n * s.throughput(1)) for n in s.devices]
            ax.plot(*zip(*ideal), color=s.color, label=f"ideal: {s.label}", **IDEAL_STYLE)
            data[f"ideal: {s.label}"] = ideal
    for (_, panel), ax in panels.items():
        _log2_devices_axis(ax, _all_devices([s for s in series if s.panel == panel]))
        # Linear from 0, so the numbers read straight off the axis.
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylabel(f"{unit}, all devices")
        ax.set_title(_title(panel, series, names))
        ax.grid(True, alpha=0.3)
    handles["ideal: N x the series' 1-device figure"] = Line2D([], [], color="grey", **IDEAL_STYLE)
    _legend_below(fig, handles)
    return Plot(f"{workload}-throughput", f"{workload}: throughput", caption, fig, data)


def efficiency_plot(workload: str, series: list[Series], caption: str) -> Plot:
    if not _scaled(series):  # every efficiency would be 1 by definition: no figure
        return Plot(f"{workload}-efficiency", f"{workload}: scaling efficiency", caption, Figure(), {})
    fig, panels = _grid(f"{workload}: scaling efficiency (1.0 = linear)", [""], [""])
    ax = panels["", ""]
    ax.axhline(1.0, color="grey", **IDEAL_STYLE)
    data, handles = {}, {}
    for i, s in enumerate(series):
        points = [(n, s.efficiency[n]) for n in s.devices if s.efficiency[n] == s.efficiency[n]]
        if points:
            ax.plot(*zip(*points), color=s.color, marker=s.marker, linestyle=s.linestyle, label=s.label,
                    **_overlap_style(i, len(series)))
            data[s.label] = points
            handles[s.label] = _series_handle(s)
            _mark_oversubscribed(ax, s, points, handles)
    _log2_devices_axis(ax, _all_devices(series))
    top = max([1.0, *(y for points in data.values() for _, y in points)])
    ax.set_ylim(0, top * 1.1)
    ax.set_ylabel("efficiency = sps(N) / (N x sps(1))")
    ax.grid(True, alpha=0.3)
    _legend_below(fig, handles)
    return Plot(f"{workload}-efficiency", f"{workload}: scaling efficiency", caption, fig, data)


def loss_plot(workload: str, series: list[Series], caption: str) -> Plot:
    """One panel per device count: the fair comparison is backends on the same N, whose curves should agree
    (same samples in the same order); across N the global batch differs under weak scaling. One row per model
    size where there are several: their losses are different experiments."""
    devices = _all_devices(series)
    sizes = sorted({s.key.model_size for s in series})
    rows = [f"model {size}" for size in sizes] if len(sizes) > 1 else [""]
    fig, panels = _grid(f"{workload}: training loss (global mean over all ranks)", rows, devices, sharey="row")
    data, handles = {}, {}
    for (row, n), ax in panels.items():
        drawn = [s for s in series if n in s.runs and (s.runs[n].get("loss") or {}).get("curve")
                 and (not row or row == f"model {s.key.model_size}")]
        for i, s in enumerate(drawn):
            points = [(step, loss) for step, loss in s.runs[n]["loss"]["curve"]]
            # Markers at staggered steps, so that coinciding curves show every colour.
            every = max(1, len(points) // 6)
            ax.plot(*zip(*points), color=s.color, linestyle=s.linestyle, label=s.label, marker=s.marker,
                    markevery=(i * every // max(1, len(drawn)), every), **_overlap_style(i, len(drawn)))
            data[f"{s.label} · N={n}"] = points
            handles[s.label] = Line2D([], [], color=s.color, linestyle=s.linestyle, marker=s.marker)
        ax.set_title(f"{row} · N = {n}" if row else f"N = {n}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
    for row in rows:
        panels[row, devices[0]].set_ylabel("training loss")
    _legend_below(fig, handles)
    return Plot(f"{workload}-loss", f"{workload}: loss curves", caption, fig, data)


def time_to_accuracy_plot(workload: str, series: list[Series], caption: str) -> Plot:
    metric = next((r["eval"]["metric"] for s in series for r in s.runs.values() if r.get("eval")), "accuracy")
    devices, names = _all_devices(series), _panels(series)
    fig, panels = _grid(f"{workload}: {metric} against wall-clock training time", names, devices, sharey=True)
    data, handles = {}, {}
    top = 0.0
    for (panel, n), ax in panels.items():
        drawn = [s for s in series if n in s.runs and s.panel == panel and s.runs[n].get("eval_history")]
        for i, s in enumerate(drawn):
            points = [(h["elapsed_s"], h["value"]) for h in s.runs[n]["eval_history"]]
            ax.plot(*zip(*points), color=s.color, marker=s.marker, linestyle=s.linestyle, label=s.label,
                    **_overlap_style(i, len(drawn)))
            data[f"{s.label} · N={n}"] = points
            handles[s.label] = _series_handle(s)
            top = max(top, *(v for _, v in points))
        ax.set_title(f"{panel} · N = {n}" if len(names) > 1 else f"N = {n}", fontsize="medium")
        ax.set_xlabel("seconds since training began")
        # From zero on both axes (accuracy up to 1): a cut axis makes small differences look large.
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
    for ax in panels.values():
        ax.set_ylim(0, max(1.0, top) * 1.02)
    for panel in names:
        panels[panel, devices[0]].set_ylabel(metric)
    _legend_below(fig, handles)
    return Plot(f"{workload}-time-to-accuracy", f"{workload}: time to accuracy", caption, fig, data)


def step_time_plot(workload: str, series: list[Series], caption: str) -> Plot:
    """A box plot of each run's per-step times (slowest rank per step) where the record holds them;
    for older records, a range from the statistics: a line from min to max, a box from p50 to p90.
    Either way a dot marks the mean."""
    names = _panels(series)
    fig, panels = _grid(f"{workload}: step time per measured step", [""], names)
    data, handles = {}, {}
    for panel in names:
        ax, mine = panels["", panel], [s for s in series if s.panel == panel]
        devices, width = _all_devices(mine), 0.8 / len(mine)
        for i, s in enumerate(mine):
            data[s.label] = []
            handles[s.label] = Patch(facecolor=s.color, edgecolor=s.color, alpha=0.5, hatch=s.hatch)
            for slot, n in enumerate(devices):
                if n not in s.runs:
                    continue
                st, samples = s.runs[n]["step_time_s"], s.runs[n].get("step_times_s")
                x = slot - 0.4 + width * (i + 0.5)
                if samples:
                    box = ax.boxplot([[v * 1e3 for v in samples]], positions=[x], widths=width * 0.7,
                                     patch_artist=True, showfliers=True, whis=(5, 95),
                                     medianprops={"color": "black"},
                                     flierprops={"markersize": 2, "markeredgecolor": s.color})
                    for patch in box["boxes"]:
                        patch.set(facecolor=s.color, alpha=0.5, hatch=s.hatch)
                else:
                    ax.vlines(x, st["min"] * 1e3, st["max"] * 1e3, color=s.color, linewidth=1)
                    ax.bar(x, (st["p90"] - st["p50"]) * 1e3, bottom=st["p50"] * 1e3, width=width * 0.7,
                           color=s.color, alpha=0.5, edgecolor=s.color, hatch=s.hatch)
                ax.plot([x], [st["mean"] * 1e3], marker="o", color="black", markersize=3)
                data[s.label].append((n, dict(st)))
        ax.set_xticks(range(len(devices)), [f"N = {n}" for n in devices])
        ax.set_xlim(-0.6, len(devices) - 0.4)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("step time (ms)")
        ax.set_title(_title(panel, series, names))
        ax.grid(True, axis="y", alpha=0.3)
    _legend_below(fig, handles)
    caption = ("Boxes: quartiles of the measured steps' times (slowest rank per step), whiskers at the 5th and "
               "95th percentiles, dots the mean; records without per-step times show min-max and p50-p90. "
               f"{caption}")
    return Plot(f"{workload}-step-time", f"{workload}: step-time distribution", caption, fig, data)


PLOTTERS = (throughput_plot, efficiency_plot, step_time_plot, loss_plot, time_to_accuracy_plot)
