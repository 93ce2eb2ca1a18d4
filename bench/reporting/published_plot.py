"""bench.predict --published's figure and tables: each point's predicted figure against its published one on log
axes, coloured by GPU generation, with the diagonal and the +-15% and +-35% bands the model is held to (refused points
are listed in the caption); the points grouped by GPU generation and publisher, and each group's errors."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.plots import Plot
from common.predict.published import error_line

FILE = "published.json"
MARKERS = {"tokens_per_s_per_gpu": "o", "tflops_per_gpu": "s", "mfu": "^"}
COLOURS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple")   # by generation, in sorted order


def group_line(group: dict) -> str:
    """One of check()'s groups (a GPU generation or a publisher) in a line: its counts and errors."""
    return (f"{group['group']}: {group['predicted']} predicted, {group['refused']} refused"
            + (f"; {error_line(group)}" if group["predicted"] else ""))


def published_plot(result: dict, slug: str = "predicted-vs-published") -> Plot:
    rows = [r for r in result["points"] if r.get("predicted") is not None]
    refused = [r["name"] for r in result["points"] if r.get("refused")]
    generations = sorted({r["generation"] for r in result["points"]})
    colour = dict(zip(generations, COLOURS))
    title = f"bench.predict against published GPU-cluster results: {len(rows)} points, {error_line(result)}"
    caption = ("Each point: a published figure (x) and the model's prediction of it (y), in the publisher's own "
               "metric, coloured by GPU generation; the diagonal is exact, the bands +-15% and +-35%. "
               + " ".join(group_line(g) + "." for g in result["groups"] if g["by"] == "generation")
               + (f" Refused (not modelled): {len(refused)} points ({', '.join(refused[:4])}...)." if refused else ""))
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    axes = fig.subplots(1, len(MARKERS))
    fig.suptitle("\n".join(textwrap.wrap(title, 170) + textwrap.wrap(caption, 170)), fontsize="small")
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
            ax.scatter(r["published"], r["predicted"], marker=marker, s=40, zorder=3, color=colour[r["generation"]])
            ax.annotate(f"{r['name'].split(',')[0]} {r['devices']} ({r['error']:+.0%})",
                        (r["published"], r["predicted"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"published {metric}",
               ylabel=f"predicted {metric}")
        ax.grid(True, alpha=0.3)
        shown = sorted({r["generation"] for r in mine})
        ax.legend(handles=[Line2D([], [], marker=marker, linestyle="", color=colour[g], label=g) for g in shown],
                  title="GPU", fontsize="small", loc="upper left")
        data[metric] = [(r["name"], r["published"], r["predicted"], r["error"]) for r in mine]
    return Plot(slug, title, caption, fig, data)


COLUMNS = ["GPU", "publisher", "point", "metric", "published", "predicted", "error", "on every table measured",
           "layout as modelled"]
REFUSED_COLUMNS = ["GPU", "publisher", "point", "metric", "published", "why refused"]
GROUP_COLUMNS = ["by", "group", "predicted", "refused", "median |error|", "largest |error|",
                 "worst table: median", "worst table: largest"]


def _by_group(result: dict, predicted: bool) -> list[dict]:
    """The predicted points (or the refused), by GPU generation then publisher, the file's order within a group."""
    return sorted((r for r in result["points"] if (r.get("predicted") is not None) == predicted),
                  key=lambda r: (r["generation"], r["publisher"]))


def rows(result: dict) -> list[list[str]]:
    """One row a predicted point: its error on the bundled table and its range over every table measured of its
    part."""
    out = []
    for r in _by_group(result, predicted=True):
        errors = [r["error"], *r.get("error_by_table", {}).values()]
        out.append([r["generation"], r["publisher"], r["name"], r["metric"], f"{r['published']:g}",
                    f"{r['predicted']:,.3f}" if r["predicted"] < 10 else f"{r['predicted']:,.1f}",
                    f"{r['error']:+.1%}", f"{min(errors):+.1%} to {max(errors):+.1%}",
                    f"{r['layout_full']} {r['stack']}"])
    return out


def refused_rows(result: dict) -> list[list[str]]:
    """One row a refused point, listed apart from the predicted: what was published, and why it is not predicted."""
    return [[r["generation"], r["publisher"], r["name"], r["metric"], f"{r['published']:g}", r["refused"]]
            for r in _by_group(result, predicted=False)]


def group_rows(result: dict) -> list[list[str]]:
    """One row a GPU generation, then one a publisher: points predicted and refused, median and largest |error|."""
    def pct(value):
        return "" if value is None else f"{value:.1%}"
    return [[g["by"], g["group"], str(g["predicted"]), str(g["refused"]), pct(g["median_abs_error"]),
             pct(g["max_abs_error"]), pct(g["worst_median_abs_error"]), pct(g["worst_max_abs_error"])]
            for g in result["groups"]]


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
            Text("Refused, listed apart: each point the model does not predict, with why."),
            Table(REFUSED_COLUMNS, refused_rows(result)),
            Text("By GPU generation and by publisher: points predicted and refused, and the median and largest "
                 "|error| of the predicted, on the bundled tables and on each point's worst table measured."),
            Table(GROUP_COLUMNS, group_rows(result)),
            Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png())]
