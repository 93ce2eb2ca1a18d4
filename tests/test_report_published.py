"""bench.predict --published's figure and tables (bench.reporting.published_plot) from a published.json written by
hand: each table cell, and what the figure draws read back from matplotlib."""
from __future__ import annotations

import json
import textwrap
import warnings

import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.markers import MarkerStyle

from bench.reporting import published_plot as pp
from bench.reporting.document import Heading, Image, Table, Text
from common.predict.published import error_line

POINTS = [
    {"name": "Megatron GPT, 175B", "generation": "A100", "publisher": "P", "metric": "tokens_per_s_per_gpu",
     "published": 100.0, "predicted": 110.0, "error": 0.10, "error_by_table": {"t1": 0.2, "t2": -0.05},
     "devices": 64, "layout_full": "dp8 tp8", "stack": "megatron"},
    {"name": "OPT, 175B", "generation": "H100", "publisher": "P", "metric": "mfu", "published": 0.4,
     "predicted": None, "refused": "zero2 is not modelled", "devices": 8},
    {"name": "MPT 7B", "generation": "H100", "publisher": "Q", "metric": "tokens_per_s_per_gpu", "published": 2000.0,
     "predicted": 1800.0, "error": -0.10, "devices": 8, "layout_full": "dp8", "stack": "foundry"},
    {"name": "BLOOM", "generation": "A100", "publisher": "Q", "metric": "tflops_per_gpu", "published": 4.0,
     "predicted": 5.0, "error": 0.25, "devices": 384, "layout_full": "dp8 tp4 pp12", "stack": "deepspeed"}]
GROUPS = [{"by": "generation", "group": "A100", "predicted": 2, "refused": 0, "median_abs_error": 0.175,
           "max_abs_error": 0.25, "worst_median_abs_error": 0.225, "worst_max_abs_error": 0.25},
          {"by": "generation", "group": "H100", "predicted": 1, "refused": 1, "median_abs_error": 0.1,
           "max_abs_error": 0.1, "worst_median_abs_error": 0.125, "worst_max_abs_error": 0.15},
          {"by": "publisher", "group": "P", "predicted": 0, "refused": 1, "median_abs_error": None,
           "max_abs_error": None, "worst_median_abs_error": None, "worst_max_abs_error": None}]
RESULT = {"points": POINTS, "groups": GROUPS, "median_abs_error": 0.1, "max_abs_error": 0.25,
          "worst_median_abs_error": 0.2, "worst_max_abs_error": 0.25}


def test_a_group_line_gives_its_counts_and_its_errors_only_where_it_predicted_some():
    assert pp.group_line(GROUPS[0]) == "A100: 2 predicted, 0 refused; " + error_line(GROUPS[0])
    assert pp.group_line(GROUPS[2]) == "P: 0 predicted, 1 refused"


def test_each_point_is_a_row_by_generation_then_publisher_with_its_range_over_the_tables():
    assert pp.rows(RESULT) == [
        ["A100", "P", "Megatron GPT, 175B", "tokens_per_s_per_gpu", "100", "110.0", "+10.0%", "-5.0% to +20.0%",
         "dp8 tp8 megatron"],
        ["A100", "Q", "BLOOM", "tflops_per_gpu", "4", "5.000", "+25.0%", "+25.0% to +25.0%",
         "dp8 tp4 pp12 deepspeed"],
        ["H100", "Q", "MPT 7B", "tokens_per_s_per_gpu", "2000", "1,800.0", "-10.0%", "-10.0% to -10.0%",
         "dp8 foundry"]]
    # the refused listed apart, each with why, in the same order
    later = {**POINTS[1], "name": "OPT 66B", "generation": "A100", "publisher": "Q", "refused": "no table"}
    assert pp.refused_rows({"points": [*POINTS, later]}) == [
        ["A100", "Q", "OPT 66B", "mfu", "0.4", "no table"],
        ["H100", "P", "OPT, 175B", "mfu", "0.4", "zero2 is not modelled"]]
    # a figure just under 10 keeps three decimals, 10 itself one
    edge = [{**POINTS[3], "predicted": 9.9994}, {**POINTS[3], "predicted": 10.0}]
    assert [r[5] for r in pp.rows({"points": edge})] == ["9.999", "10.0"]


def test_each_group_is_a_row_and_a_missing_error_an_empty_cell():
    assert pp.group_rows(RESULT) == [
        ["generation", "A100", "2", "0", "17.5%", "25.0%", "22.5%", "25.0%"],
        ["generation", "H100", "1", "1", "10.0%", "10.0%", "12.5%", "15.0%"],
        ["publisher", "P", "0", "1", "", "", "", ""]]


def test_the_figure_draws_each_metric_s_points_against_the_diagonal_and_the_bands():
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # drawn as matplotlib means it: no call it warns about
        plot = pp.published_plot(RESULT)
    title = "bench.predict against published GPU-cluster results: 3 points, " + error_line(RESULT)
    caption = ("Each point: a published figure (x) and the model's prediction of it (y), in the publisher's own "
               "metric, coloured by GPU generation; the diagonal is exact, the bands +-15% and +-35%. "
               + pp.group_line(GROUPS[0]) + ". " + pp.group_line(GROUPS[1]) + "."
               + " Refused (not modelled): 1 points (OPT, 175B...).")
    assert (plot.slug, plot.title, plot.caption) == ("predicted-vs-published", title, caption)
    assert pp.published_plot(RESULT, "other").slug == "other"
    assert plot.data == {"tokens_per_s_per_gpu": [("Megatron GPT, 175B", 100.0, 110.0, 0.10),
                                                  ("MPT 7B", 2000.0, 1800.0, -0.10)],
                         "tflops_per_gpu": [("BLOOM", 4.0, 5.0, 0.25)]}
    fig = plot.figure
    assert list(fig.get_size_inches()) == [12, 6.5]
    assert fig._suptitle.get_text() == "\n".join(textwrap.wrap(title, 170) + textwrap.wrap(caption, 170))
    tokens, tflops, mfu = fig.axes
    assert [ax.get_visible() for ax in fig.axes] == [True, True, False]  # no mfu point was predicted
    lo, hi = 100.0 / 1.5, 2000.0 * 1.5                                     # the smallest and largest figure
    (diagonal,) = tokens.get_lines()
    assert list(diagonal.get_xdata()) == [lo, hi] and list(diagonal.get_ydata()) == [lo, hi]
    assert diagonal.get_color() == "black" and diagonal.get_linewidth() == 1
    bands = [c for c in tokens.collections if isinstance(c, PolyCollection)]
    assert [c.get_alpha() for c in bands] == [0.15, 0.07] and [list(c.get_linewidth()) for c in bands] == [[0], [0]]
    for band, width in zip(bands, (0.15, 0.35)):
        corners = {(round(x, 6), round(y, 6)) for x, y in band.get_paths()[0].vertices}
        assert {(round(x, 6), round(x * f, 6)) for x in (lo, hi) for f in (1 - width, 1 + width)} <= corners
        assert to_rgba(band.get_facecolor()[0], 1) == to_rgba("tab:green")
    points = [c for c in tokens.collections if isinstance(c, PathCollection)]
    assert [tuple(c.get_offsets()[0]) for c in points] == [(100.0, 110.0), (2000.0, 1800.0)]
    assert [tuple(c.get_facecolor()[0]) for c in points] == [to_rgba("tab:orange"), to_rgba("tab:blue")]
    assert [t.get_text() for t in tokens.texts] == ["Megatron GPT 64 (+10%)", "MPT 7B 8 (-10%)"]
    # the points over the bands, each label small, beside its point
    assert [(list(c.get_sizes()), c.get_zorder()) for c in points] == [([40], 3), ([40], 3)]
    assert [(t.get_fontsize(), t.xyann, t.anncoords, t.xy) for t in tokens.texts] == [
        (6, (3, 3), "offset points", (100.0, 110.0)), (6, (3, 3), "offset points", (2000.0, 1800.0))]
    assert fig._suptitle.get_fontsize() == FontProperties(size="small").get_size_in_points()
    assert (tokens.get_xscale(), tokens.get_yscale()) == ("log", "log")
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    assert tokens.get_position().y0 == tflops.get_position().y0 < tokens.get_position().x1 <= tflops.get_position().x0
    assert tokens.xaxis.get_gridlines()[0].get_visible() and tokens.xaxis.get_gridlines()[0].get_alpha() == 0.3
    square = MarkerStyle("s")
    (bloom,) = [c for c in tflops.collections if isinstance(c, PathCollection)]
    assert (bloom.get_paths()[0].vertices == square.get_path().transformed(square.get_transform()).vertices).all()
    assert tokens.get_xlim() == pytest.approx((lo, hi)) and tokens.get_ylim() == pytest.approx((lo, hi))
    assert (tokens.get_xlabel(), tokens.get_ylabel()) == ("published tokens_per_s_per_gpu",
                                                          "predicted tokens_per_s_per_gpu")
    legend = tokens.get_legend()
    assert legend._loc == 2 and legend._fontsize == FontProperties(size="small").get_size_in_points()  # upper left
    assert legend.get_title().get_text() == "GPU" and [t.get_text() for t in legend.get_texts()] == ["A100", "H100"]
    assert [h.get_color() for h in legend.legend_handles] == ["tab:orange", "tab:blue"]
    assert [(h.get_marker(), h.get_linestyle()) for h in legend.legend_handles] == [("o", "None"), ("o", "None")]
    # the teraFLOP/s panel: squares, its own range, A100 alone
    assert tflops.get_xlim() == pytest.approx((4.0 / 1.5, 5.0 * 1.5))
    assert [t.get_text() for t in tflops.get_legend().get_texts()] == ["A100"]
    assert [h.get_marker() for h in tflops.get_legend().legend_handles] == ["s"]
    assert [t.get_text() for t in tflops.texts] == ["BLOOM 384 (+25%)"]


def test_a_title_longer_than_a_line_breaks_within_170_characters(monkeypatch):
    prefix = "bench.predict against published GPU-cluster results: 3 points, "
    n = 171 - len(prefix)
    words = "a" * (2 - n % 2) + " a" * ((n - 2 + n % 2) // 2)   # 171 characters in all, a blank the 170th
    monkeypatch.setattr(pp, "error_line", lambda result: words)
    assert len(prefix + words) == 171
    lines = pp.published_plot(RESULT).figure._suptitle.get_text().split("\n")
    assert [len(line) for line in lines[:2]] == [169, 1]


def test_the_caption_names_no_refusal_when_none_was_refused():
    kept = [p for p in POINTS if p.get("predicted") is not None]
    plot = pp.published_plot({**RESULT, "points": kept})
    assert "Refused" not in plot.caption and plot.caption.endswith(pp.group_line(GROUPS[1]) + ".")
    refused = [{**POINTS[1], "name": f"R{i}, x"} for i in range(6)]
    # the first four refusals named, the count of all
    assert pp.published_plot({**RESULT, "points": kept + refused}).caption.endswith(
        " Refused (not modelled): 6 points (R0, x, R1, x, R2, x, R3, x...).")
    assert plot.figure.axes[0].get_xlabel() == "published tokens_per_s_per_gpu"
    # a metric without a point hides its panel and the next is still drawn
    mfu = {**POINTS[1], "predicted": 0.5, "error": 0.25, "refused": None, "layout_full": "dp8", "stack": "x"}
    drawn = pp.published_plot({**RESULT, "points": [POINTS[0], mfu]})
    assert [ax.get_visible() for ax in drawn.figure.axes] == [True, False, True] and list(drawn.data) == [
        "tokens_per_s_per_gpu", "mfu"]


def test_the_report_section_reads_published_json(tmp_path):
    assert pp.published_blocks(tmp_path) == []
    (tmp_path / pp.FILE).write_text("{")
    assert pp.published_blocks(tmp_path) == []
    (tmp_path / pp.FILE).write_text(json.dumps(RESULT))
    blocks = pp.published_blocks(tmp_path)
    plot = pp.published_plot(RESULT)
    assert blocks[0] == Heading("Prediction against published GPU-cluster results", 2)
    assert blocks[1] == Text(f"bench.predict --published (published.json): {plot.title}. Each error is predicted / "
                             "published - 1 in the publisher's metric (docs/prediction-at-scale.md).")
    assert blocks[2] == Table(pp.COLUMNS, pp.rows(RESULT))
    assert blocks[3] == Text("Refused, listed apart: each point the model does not predict, with why.")
    assert blocks[4] == Table(pp.REFUSED_COLUMNS, [["H100", "P", "OPT, 175B", "mfu", "0.4", "zero2 is not modelled"]])
    assert blocks[5] == Text("By GPU generation and by publisher: points predicted and refused, and the median and "
                             "largest |error| of the predicted, on the bundled tables and on each point's worst table "
                             "measured.")
    assert blocks[6] == Table(pp.GROUP_COLUMNS, pp.group_rows(RESULT))
    image = blocks[7]
    assert isinstance(image, Image) and (image.path, image.title, image.caption) == (
        "plots/predicted-vs-published.png", plot.title, plot.caption)
    assert image.png.startswith(b"\x89PNG") and len(blocks) == 8
