"""bench.predict's figure: predicted throughput and memory per rank against devices, one line per layout; a point
that does not fit is drawn hollow above the device's memory, shaded."""
from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

from bench.reporting.plots import Plot, _log2_devices_axis

GIB = 2**30


def prediction_plot(rows: list[dict], memory_bytes: float, title: str, caption: str, slug: str) -> Plot:
    """`rows`: bench.predict's predictions (layout name, devices, samples_per_s, memory_per_rank_max, fits)."""
    fig = Figure(figsize=(12, 6.0), layout="constrained")
    speed, memory = fig.subplots(1, 2)
    fig.suptitle(title + "\n" + "\n".join(textwrap.wrap(caption, 160)), fontsize="small")
    data: dict[str, list] = {}
    devices = sorted({r["devices"] for r in rows})
    for name in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == name and r.get("samples_per_s")]
        if not mine:
            continue
        xs = [r["devices"] for r in mine]
        line, = speed.plot(xs, [r["samples_per_s"] for r in mine], marker="o", label=name)
        memory.plot(xs, [r["memory_per_rank_max"] / GIB for r in mine], marker="o", color=line.get_color())
        for ax, key, scale in ((speed, "samples_per_s", 1), (memory, "memory_per_rank_max", GIB)):
            bad = [r for r in mine if not r["fits"]]
            ax.scatter([r["devices"] for r in bad], [r[key] / scale for r in bad], s=90, facecolors="white",
                       edgecolors=line.get_color(), zorder=3)
        data[name] = [(r["devices"], r["samples_per_s"], r["memory_per_rank_max"], r["fits"]) for r in mine]
    memory.axhline(memory_bytes / GIB, color="black", linewidth=1)
    top = max([memory_bytes / GIB * 1.5] + [r["memory_per_rank_max"] / GIB * 1.1 for r in rows
                                            if r.get("memory_per_rank_max")])
    memory.axhspan(memory_bytes / GIB, top, color="red", alpha=0.08, label="does not fit (hollow points)")
    memory.set_ylim(0, top)
    speed.set_yscale("log")
    speed.set_ylabel("predicted samples/s, all devices")
    memory.set_ylabel("predicted memory per rank, most loaded (GiB)")
    for ax in (speed, memory):
        _log2_devices_axis(ax, devices)
        ax.grid(True, alpha=0.3)
    speed.legend(fontsize="small", title="layout")
    memory.legend(fontsize="small", loc="upper left")
    return Plot(slug, title, caption, fig, data)
