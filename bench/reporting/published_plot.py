"""bench.predict --published's figure: each point's predicted figure against its published one on log axes, with
the diagonal and the +-15% and +-35% bands the model is held to; refused points are listed in the caption."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from matplotlib.figure import Figure

from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.plots import Plot

FILE = "published.json"

MARKERS = {"tokens_per_s_per_gpu": "o", "tflops_per_gpu": "s", "mfu": "^"}


def published_plot(result: dict, slug: str = "predicted-vs-published") -> Plot:
    rows = [r for r in result["points"] if r.get("predicted") is not None]
    refused = [r["name"] for r in result["points"] if r.get("refused")]
    title = (f"bench.predict against published GPU-cluster results: {len(rows)} points, median |error| "
             f"{result['median_abs_error']:.1%}, largest {result['max_abs_error']:.1%}")
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
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"published {metric}")
        ax.set_ylabel(f"predicted {metric}")
        ax.grid(True, alpha=0.3)
        data[metric] = [(r["name"], r["published"], r["predicted"], r["error"]) for r in mine]
    return Plot(slug, title, caption, fig, data)


def published_blocks(results: Path) -> list[Block]:
    """The report's section: the published points' table and the figure, when RESULTS/published.json exists."""
    path = Path(results) / FILE
    if not path.is_file():
        return []
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    plot = published_plot(result)
    rows = [[r["name"], r["metric"], f"{r['published']:g}",
             "refused" if r.get("predicted") is None else f"{r['predicted']:.4g}",
             "" if r.get("error") is None else f"{r['error']:+.1%}", r.get("refused") or r.get("layout_full", "")]
            for r in result["points"]]
    return [Heading("Prediction against published GPU-cluster results", 2),
            Text(f"bench.predict --published ({FILE}): {plot.title}. Each error is predicted / published - 1 in the "
                 "publisher's metric (docs/prediction-at-scale.md)."),
            Table(["point", "metric", "published", "predicted", "error", "layout as modelled / why refused"], rows),
            Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png())]
