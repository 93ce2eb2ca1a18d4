"""bench.predict --published's figure: each point's predicted figure against its published one on log axes, with
the diagonal and the +-15% and +-35% bands the model is held to; refused points are listed in the caption."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from matplotlib.figure import Figure

from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.plots import Plot
from common.predict.published import error_line

FILE = "published.json"
MARKERS = {"tokens_per_s_per_gpu": "o", "tflops_per_gpu": "s", "mfu": "^"}


def published_plot(result: dict, slug: str = "predicted-vs-published") -> Plot:
    rows = [r for r in result["points"] if r.get("predicted") is not None]
    refused = [r["name"] for r in result["points"] if r.get("refused")]
    title = f"bench.predict against published GPU-cluster results: {len(rows)} points, {error_line(result)}"
    caption = ("Each point: a published figure (x) and the model's prediction of it (y), in the publisher's own "
               "metric; the diagonal is exact, the bands +-15% and +-35%."
               + (f" Refused (not modelled): {len(refused)} points ({', '.join(refused[:4])}...)." if refused else ""))
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    axes = fig.subplots(1, len(MARKERS))
    fig.suptitle(title + "\n" + "\n".join(textwrap.wrap(caption, 170)), fontsize="small")
    data: dict[str, list] = {}
    for ax, (metric, marker) in zip(axes, MARKERS.items()):
        mine = [r for r in rows if r["metric"] == metric]
        if not mine:
            ax.set_visible(False)
            continue
        lo = min(min(r["published"], r["predicted"]) for r in mine) / 1.5
        hi = max(max(r["published"], r["predicted"]) for r in mine) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=1)
        for band, alpha in ((0.15, 0.15), (0.35, 0.07)):
            ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                            color="tab:green", alpha=alpha, linewidth=0)
        for r in mine:
            ax.scatter(r["published"], r["predicted"], marker=marker, s=40, zorder=3,
                       color="tab:blue" if r["hardware"].startswith("h100-sxm") else "tab:orange")
            ax.annotate(f"{r['name'].split(',')[0]} {r['devices']} ({r['error']:+.0%})",
                        (r["published"], r["predicted"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"published {metric}",
               ylabel=f"predicted {metric}")
        ax.grid(True, alpha=0.3)
        data[metric] = [(r["name"], r["published"], r["predicted"], r["error"]) for r in mine]
    return Plot(slug, title, caption, fig, data)


COLUMNS = ["point", "metric", "published", "predicted", "error", "on every table measured",
           "layout as modelled / why refused", "source"]


def rows(result: dict) -> list[list[str]]:
    """One row a point: its error on the bundled table and its range over every table measured of its part."""
    out = []
    for r in result["points"]:
        if r.get("predicted") is None:
            out.append([r["name"], r["metric"], f"{r['published']:g}", "refused", "", "",
                        r["refused"].split(": ", 1)[-1], r["source"].split(":")[0]])
            continue
        errors = [r["error"], *r.get("error_by_table", {}).values()]
        out.append([r["name"], r["metric"], f"{r['published']:g}",
                    f"{r['predicted']:,.3f}" if r["predicted"] < 10 else f"{r['predicted']:,.1f}",
                    f"{r['error']:+.1%}", f"{min(errors):+.1%} to {max(errors):+.1%}",
                    f"{r['layout_full']} {r['stack']}", r["source"].split(":")[0]])
    return out


def published_blocks(results: Path) -> list[Block]:
    """The report's section: the published points' table and the figure, when RESULTS/published.json exists."""
    try:
        result = json.loads((Path(results) / FILE).read_text())
    except (OSError, ValueError):
        return []
    plot = published_plot(result)
    return [Heading("Prediction against published GPU-cluster results", 2),
            Text(f"bench.predict --published ({FILE}): {plot.title}. Each error is predicted / published - 1 in the "
                 "publisher's metric (docs/prediction-at-scale.md)."),
            Table(COLUMNS, rows(result)),
            Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png())]
