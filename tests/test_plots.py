"""The report's figures (bench.reporting.plots) drawn from a few hand-made series and read back from matplotlib:
which points each line holds, how lines that coincide stay visible, the axes a reader reads the numbers off,
the legend below. tests/test_report.py holds the same figures to a whole fixture sweep's records."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from matplotlib.colors import to_rgba
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import MaxNLocator, NullLocator

from bench.reporting import plots
from bench.reporting.series import Series
from tests.test_predict import matplotlib_small

RED, BLUE = "#d62728", "#1f77b4"


def _run(n: int, sps: float, workload: str = "cnn", **extra) -> dict:
    return {"workload": workload, "devices": n, "samples_per_s": sps, "tokens_per_s": sps * 128, **extra}


def _series(label: str, runs: dict[int, dict], color: str = BLUE, panel: str = "h · cpu", marker: str = "o",
            linestyle="-", hatch: str = "", efficiency: dict | None = None, size: str = "base") -> Series:
    return Series(key=SimpleNamespace(model_size=size), sweep="s", cells={}, label=label, color=color,
                  marker=marker, linestyle=linestyle, hatch=hatch, runs=runs,
                  efficiency=efficiency if efficiency is not None else dict.fromkeys(runs, 1.0), panel=panel)


def _lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def _points(line) -> list[tuple]:
    return list(zip(line.get_xdata(), line.get_ydata()))


def _legend(fig) -> list[str]:
    [legend] = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def _scaled_pair() -> list[Series]:
    """ddp at 1, 2 and 4 devices (virtual at 2 and 4, oversubscribed at 4); dp at 2 and 4 only: no ideal line."""
    ddp = _series("ddp", {1: _run(1, 100.0), 2: _run(2, 180.0, virtual=True),
                          4: _run(4, 300.0, virtual=True, oversubscribed=True)},
                  efficiency={1: 1.0, 2: 0.9, 4: 0.75})
    dp = _series("dp", {2: _run(2, 150.0), 4: _run(4, 250.0)}, color=RED, marker="s", linestyle="--",
                 efficiency={2: float("nan"), 4: 1.25})
    return [ddp, dp]


def test_throughput_draws_each_series_with_its_ideal_line_on_a_log2_device_axis():
    ddp, dp = _scaled_pair()
    plot = plots.throughput_plot("cnn", [ddp, dp], "cap")
    assert (plot.slug, plot.title, plot.caption, plot.absent) == ("cnn-throughput", "cnn: throughput", "cap", [])
    assert plot.data == {"ddp": [(1, 100.0), (2, 180.0), (4, 300.0)],
                         "ideal: ddp": [(1, 100.0), (2, 200.0), (4, 400.0)],
                         "dp": [(2, 150.0), (4, 250.0)]}
    fig = plot.figure
    assert fig.get_suptitle() == "cnn: throughput against devices"
    assert tuple(fig.get_size_inches()) == (7.5, 4.4)
    assert _png_size(plot.png()) == (825, 484)      # 110 dpi
    [ax] = fig.axes
    lines = _lines(ax)
    assert set(lines) == {"ddp", "dp", "_virtual: ddp", "_oversubscribed", "ideal: ddp"}
    first, second = lines["ddp"], lines["dp"]
    assert _points(first) == plot.data["ddp"] and _points(second) == plot.data["dp"]
    # Coinciding lines stay visible: the first drawn is wider, the second narrower on top.
    assert (first.get_linewidth(), first.get_markersize(), first.get_zorder()) == (3.0, 8.0, 2)
    assert (second.get_linewidth(), second.get_markersize(), second.get_zorder()) == (1.2, 5.0, 3)
    assert (first.get_color(), first.get_marker(), first.get_linestyle()) == (BLUE, "o", "-")
    assert (second.get_color(), second.get_marker(), second.get_linestyle()) == (RED, "s", "--")
    hollow = lines["_virtual: ddp"]
    assert _points(hollow) == [(2, 180.0), (4, 300.0)]
    assert (hollow.get_linestyle(), hollow.get_marker(), hollow.get_markersize()) == ("None", "o", 9)
    assert (hollow.get_markerfacecolor(), hollow.get_markeredgecolor()) == ("white", BLUE)
    ring = lines["_oversubscribed"]
    assert _points(ring) == [(4, 300.0)]
    assert (ring.get_marker(), ring.get_markersize(), ring.get_markerfacecolor(), ring.get_markeredgecolor(),
            ring.get_markeredgewidth(), ring.get_linestyle()) == ("o", 20, "none", "black", 1.2, "None")
    ideal = lines["ideal: ddp"]
    assert _points(ideal) == plot.data["ideal: ddp"]
    assert (ideal.get_color(), ideal.get_linewidth(), ideal.get_alpha()) == (BLUE, 1, 0.7)
    assert ideal.get_linestyle() == "--" and ideal._unscaled_dash_pattern == (0, (2, 2))
    # Device counts on a log2 axis, ticked where runs are, as integers; samples/s linear from zero.
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [1, 2, 4] and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert isinstance(ax.xaxis.get_minor_locator(), NullLocator)
    assert ax.get_xlim() == (pytest.approx(1 / 1.3), pytest.approx(4 * 1.3))
    assert ax.get_xlabel() == "devices (N)" and ax.get_ylabel() == "samples/s, all devices"
    assert ax.get_ylim()[0] == 0 and ax.yaxis.get_major_formatter()(12345.6, 0) == "12,346"
    assert ax.get_title() == "h · cpu (hollow markers: virtual devices)"
    assert all(g.get_visible() and g.get_alpha() == 0.3 for g in [*ax.get_xgridlines(), *ax.get_ygridlines()])
    assert _legend(fig) == ["ddp", "oversubscribed: devices x threads > cores", "dp",
                            "ideal: N x the series' 1-device figure"]
    handles = fig.legends[0].legend_handles
    assert (handles[0].get_color(), handles[0].get_marker(), handles[0].get_linestyle()) == (BLUE, "o", "-")
    assert (handles[2].get_color(), handles[2].get_marker(), handles[2].get_linestyle()) == (RED, "s", "--")
    assert handles[3].get_color() == "grey" and handles[3].get_alpha() == 0.7
    # the oversubscribed key: a hollow black ring, no line
    ring = handles[1]
    assert (ring.get_marker(), ring.get_markersize(), ring.get_markerfacecolor(), ring.get_markeredgecolor(),
            ring.get_markeredgewidth(), ring.get_linestyle()) == ("o", 20, "none", "black", 1.2, "None")


def test_the_legend_below_takes_as_many_columns_as_its_longest_label_leaves_room_for():
    ddp, dp = _scaled_pair()
    [legend] = plots.throughput_plot("cnn", [ddp, dp], "c").figure.legends
    # 7.5 in x 110 dpi = 825 px; the longest label, 41 characters, takes 6 x 41 + 50 = 296 px: two columns.
    assert legend._ncols == 2 and legend._loc == 8 and legend._outside_loc == "lower"
    assert all(t.get_fontsize() == pytest.approx(matplotlib_small()) for t in legend.get_texts())
    # Short labels on four panels (the figure at its widest, 14 in): at most three columns.
    four = [_series(name, {1: _run(1, 10.0), 2: _run(2, 19.0)}, panel=f"m{i}") for i, name in enumerate("abcd")]
    fig = plots.efficiency_plot("cnn", four, "c").figure
    assert fig.legends[0]._ncols == 3
    assert tuple(plots.throughput_plot("cnn", four, "c").figure.get_size_inches()) == (14, 4.4)
    # 14 in = 1540 px: a 120-character label takes 770 px, two columns; one more character, one column.
    for length, columns in ((120, 2), (121, 1)):
        named = [_series(name * length, {1: _run(1, 10.0), 2: _run(2, 19.0)}, panel=f"m{i}")
                 for i, name in enumerate("abcd")]
        assert plots.throughput_plot("cnn", named, "c").figure.legends[0]._ncols == columns
    # One long label: one column, never none.
    wide = [_series("x" * 200, {1: _run(1, 10.0), 2: _run(2, 19.0)})]
    assert plots.efficiency_plot("cnn", wide, "c").figure.legends[0]._ncols == 1


def test_throughput_of_a_token_workload_is_in_tokens_and_panels_split_machines():
    one = _series("a", {1: _run(1, 10.0, "mlm"), 2: _run(2, 18.0, "mlm")}, panel="g · cuda")
    other = _series("b", {1: _run(1, 1.0, "mlm"), 4: _run(4, 3.0, "mlm")}, panel="h · cpu")
    plot = plots.throughput_plot("mlm", [other, one], "c")
    assert tuple(plot.figure.get_size_inches()) == (pytest.approx(9.2), 4.4)
    left, right = plot.figure.axes
    assert (left.get_title(), right.get_title()) == ("g · cuda", "h · cpu")     # panels sorted by machine
    assert _points(_lines(left)["a"]) == [(1, 1280.0), (2, 2304.0)]
    assert list(right.get_xticks()) == [1, 4] and left.get_ylabel() == "tokens/s, all devices"
    assert not left.get_shared_y_axes().joined(left, right)     # machines orders of magnitude apart
    # Alone on its panel, each line is a plain line; one panel of real devices needs no title.
    assert (_lines(left)["a"].get_linewidth(), _lines(left)["a"].get_markersize()) == (1.2, 5)
    [ax] = plots.throughput_plot("mlm", [one], "c").figure.axes
    assert ax.get_title() == ""


def test_throughput_without_scaling_is_a_bar_per_configuration():
    slow = _series("slow", {1: _run(1, 1234.4)}, color=RED, hatch="//")
    fast = _series("fast", {1: _run(1, 2000.0)})
    other = _series("gpu", {1: _run(1, 50.0, virtual=True)}, panel="g · cuda")
    plot = plots.throughput_plot("cnn", [slow, fast, other], "cap")
    assert (plot.slug, plot.title, plot.caption) == ("cnn-throughput", "cnn: throughput", "cap")
    assert plot.data == {"slow": [(1, 1234.4)], "fast": [(1, 2000.0)], "gpu": [(1, 50.0)]}
    fig = plot.figure
    assert fig.get_suptitle() == "cnn: throughput on one device, by configuration"
    # 1 in + per panel 0.42 in a bar and 0.9: panels g (1 bar) and h (2 bars).
    assert tuple(fig.get_size_inches()) == (11, pytest.approx(1.0 + 1.32 + 1.74))
    assert type(fig.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    gpu, cpu = fig.axes
    assert [ax.get_subplotspec().get_gridspec().get_height_ratios() for ax in (gpu, cpu)] == [[2.5, 3.5]] * 2
    bars = cpu.patches
    assert [(b.get_y() + b.get_height() / 2, b.get_width()) for b in bars] == [(0, 1234.4), (1, 2000.0)]
    assert [b.get_facecolor() for b in bars] == [to_rgba(RED), to_rgba(BLUE)]
    assert [b.get_hatch() for b in bars] == ["//", ""]
    assert [(t.get_text(), t.xy) for t in cpu.texts] == [(" 1,234", (1234.4, 0)), (" 2,000", (2000.0, 1))]
    assert all(t.get_va() == "center" and t.get_fontsize() == pytest.approx(matplotlib_small()) for t in cpu.texts)
    assert [t.get_text() for t in cpu.get_yticklabels()] == ["slow", "fast"]
    assert all(t.get_fontsize() == pytest.approx(matplotlib_small()) for t in cpu.get_yticklabels())
    assert cpu.yaxis_inverted() and cpu.get_xlim() == (0, pytest.approx(2000.0 * 1.18))
    assert cpu.xaxis.get_major_formatter()(12345.6, 0) == "12,346" and cpu.get_xlabel() == "samples/s, 1 device"
    assert (gpu.get_title(), cpu.get_title()) == ("g · cuda (virtual)", "h · cpu")
    assert all(g.get_visible() and g.get_alpha() == 0.3 for g in cpu.get_xgridlines())
    assert not any(g.get_visible() for g in cpu.get_ygridlines())
    [ax] = plots.throughput_plot("mlm", [_series("t", {1: _run(1, 2.0, "mlm")})], "c").figure.axes
    assert ax.get_xlabel() == "tokens/s, 1 device" and ax.patches[0].get_width() == 256.0 and ax.get_title() == ""


def test_efficiency_draws_the_measured_ratios_against_the_linear_line():
    ddp, dp = _scaled_pair()
    plot = plots.efficiency_plot("cnn", [ddp, dp], "cap")
    assert (plot.slug, plot.title, plot.caption) == ("cnn-efficiency", "cnn: scaling efficiency", "cap")
    # dp has no 1-device run at 2 devices' side: its NaN is no point.
    assert plot.data == {"ddp": [(1, 1.0), (2, 0.9), (4, 0.75)], "dp": [(4, 1.25)]}
    fig = plot.figure
    assert fig.get_suptitle() == "cnn: scaling efficiency (1.0 = linear)"
    [ax] = fig.axes
    linear, first, ring, second = ax.get_lines()
    assert list(linear.get_ydata()) == [1.0, 1.0] and linear.get_color() == "grey" and linear.get_alpha() == 0.7
    assert (first.get_label(), _points(first)) == ("ddp", plot.data["ddp"])
    assert (first.get_color(), first.get_marker(), first.get_linestyle()) == (BLUE, "o", "-")
    assert (first.get_linewidth(), second.get_linewidth(), first.get_zorder(), second.get_zorder()) == (3, 1.2, 2, 3)
    assert (ring.get_label(), _points(ring)) == ("_oversubscribed", [(4, 0.75)])
    assert (second.get_label(), _points(second)) == ("dp", [(4, 1.25)])
    assert ax.get_ylim() == (0, pytest.approx(1.25 * 1.1)) and list(ax.get_xticks()) == [1, 2, 4]
    assert ax.get_ylabel() == "efficiency = sps(N) / (N x sps(1))"
    assert all(g.get_visible() and g.get_alpha() == 0.3 for g in ax.get_ygridlines())
    assert _legend(fig) == ["ddp", "oversubscribed: devices x threads > cores", "dp"]
    # Never above 1: the axis still reaches 1.1.
    below = [_series("a", {1: _run(1, 10.0), 2: _run(2, 9.0)}, efficiency={1: 1.0, 2: 0.45})]
    assert plots.efficiency_plot("cnn", below, "c").figure.axes[0].get_ylim() == (0, pytest.approx(1.1))


def test_nothing_scaled_gives_no_efficiency_figure():
    only_one = [_series("a", {1: _run(1, 10.0)}), _series("b", {1: _run(1, 20.0)})]
    plot = plots.efficiency_plot("cnn", only_one, "cap")
    assert (plot.slug, plot.title, plot.caption, plot.data) == ("cnn-efficiency", "cnn: scaling efficiency", "cap",
                                                                {})
    assert plot.figure.axes == []
    # One series at two devices only is scaled (no N = 1 to hold it to, but no bar either).
    assert plots.efficiency_plot("cnn", [_series("a", {2: _run(2, 10.0)}, efficiency={2: 0.5})], "c").data == {
        "a": [(2, 0.5)]}


def _loss_run(n: int, curve: list, **extra) -> dict:
    return _run(n, 10.0, loss={"curve": curve}, **extra)


def test_loss_has_a_panel_per_device_count_and_a_row_per_model_size():
    curve = [[s, 3.0 - s / 10] for s in range(1, 13)]
    a = _series("a", {1: _loss_run(1, curve), 2: _loss_run(2, curve[:6])}, marker="o")
    b = _series("b", {1: _loss_run(1, curve)}, color=RED, marker="s", linestyle="--")
    c = _series("c", {2: _run(2, 10.0, loss=None)})                     # no curve: not drawn
    plot = plots.loss_plot("cnn", [a, b, c], "cap")
    assert (plot.slug, plot.title, plot.caption) == ("cnn-loss", "cnn: loss curves", "cap")
    assert plot.data == {"a · N=1": [tuple(p) for p in curve], "b · N=1": [tuple(p) for p in curve],
                         "a · N=2": [tuple(p) for p in curve[:6]]}
    fig = plot.figure
    assert fig.get_suptitle() == "cnn: training loss (global mean over all ranks)"
    assert tuple(fig.get_size_inches()) == (pytest.approx(9.2), 4.4)
    one, two = fig.axes
    assert (one.get_title(), two.get_title()) == ("N = 1", "N = 2")
    la, lb = one.get_lines()
    assert (la.get_label(), lb.get_label(), _points(la)) == ("a", "b", [tuple(p) for p in curve])
    # Markers every 12 // 6 = 2 steps, the second curve's shifted by one, so coinciding curves show both.
    assert (la.get_markevery(), lb.get_markevery()) == ((0, 2), (1, 2))
    # whole steps: matplotlib reads a pair of floats as distances along the line, not as indices
    assert all(type(v) is int for line in (la, lb) for v in line.get_markevery())
    assert (la.get_linewidth(), lb.get_linewidth(), la.get_markersize(), lb.get_markersize()) == (3, 1.2, 8, 5)
    assert (lb.get_color(), lb.get_marker(), lb.get_linestyle(), lb.get_zorder()) == (RED, "s", "--", 3)
    [only] = two.get_lines()
    assert only.get_markevery() == (0, 1) and only.get_linewidth() == 1.2
    assert one.get_ylabel() == "training loss" and two.get_ylabel() == ""
    assert one.get_xlabel() == two.get_xlabel() == "optimizer step"
    assert all(isinstance(ax.xaxis.get_major_locator(), MaxNLocator) and ax.xaxis.get_major_locator()._integer
               for ax in (one, two))                                     # steps are whole numbers
    assert all(g.get_visible() and g.get_alpha() == 0.3 for g in one.get_ygridlines())
    assert one.get_shared_y_axes().joined(one, two)
    assert _legend(fig) == ["a", "b"]
    [handle_a, handle_b] = fig.legends[0].legend_handles
    assert (handle_b.get_color(), handle_b.get_linestyle(), handle_b.get_marker()) == (RED, "--", "s")
    # Two model sizes: a row each, each row its own y axis.
    big = _series("a", {1: _loss_run(1, curve)}, size="large")
    small = _series("a", {1: _loss_run(1, [[1, 9.0], [2, 8.0]])}, size="base")
    fig = plots.loss_plot("cnn", [big, small], "c").figure
    top, bottom = fig.axes
    assert (top.get_title(), bottom.get_title()) == ("model base · N = 1", "model large · N = 1")
    assert [_points(line) for line in top.get_lines()] == [[(1, 9.0), (2, 8.0)]]
    assert top.get_ylabel() == bottom.get_ylabel() == "training loss"
    assert not top.get_shared_y_axes().joined(top, bottom)
    assert tuple(fig.get_size_inches()) == (7.5, pytest.approx(8.0))


def _eval_run(n: int, history: list[tuple], metric: str = "masked_accuracy", **extra) -> dict:
    return _run(n, 10.0, eval={"metric": metric}, eval_history=[{"elapsed_s": t, "value": v} for t, v in history],
                **extra)


def test_time_to_accuracy_reads_from_zero_on_both_axes():
    a = _series("a", {1: _eval_run(1, [(10, 0.2), (20, 0.4)]), 2: _eval_run(2, [(5, 0.3)])})
    b = _series("b", {1: _eval_run(1, [(12, 0.25)])}, color=RED, marker="s", linestyle=":")
    c = _series("c", {2: _run(2, 1.0)})                                 # no history: not drawn
    plot = plots.time_to_accuracy_plot("mlm", [a, b, c], "cap")
    assert (plot.slug, plot.title, plot.caption) == ("mlm-time-to-accuracy", "mlm: time to accuracy", "cap")
    assert plot.data == {"a · N=1": [(10, 0.2), (20, 0.4)], "b · N=1": [(12, 0.25)], "a · N=2": [(5, 0.3)]}
    fig = plot.figure
    assert fig.get_suptitle() == "mlm: masked_accuracy against wall-clock training time"
    one, two = fig.axes
    assert (one.get_title(), two.get_title()) == ("N = 1", "N = 2")
    assert one.title.get_fontsize() == FontProperties(size="medium").get_size_in_points()
    la, lb = one.get_lines()
    assert (la.get_label(), _points(la)) == ("a", [(10, 0.2), (20, 0.4)])
    assert (lb.get_label(), _points(lb)) == ("b", [(12, 0.25)])
    assert (la.get_linewidth(), lb.get_linewidth(), lb.get_color(), lb.get_marker(), lb.get_linestyle()) == \
        (3, 1.2, RED, "s", ":")
    for ax in (one, two):
        assert ax.get_ylim() == (0, pytest.approx(1.02)) and ax.get_xlim()[0] == 0
        assert ax.get_xlabel() == "seconds since training began"
        assert all(g.get_visible() and g.get_alpha() == 0.3 for g in ax.get_ygridlines())
    assert one.get_ylabel() == "masked_accuracy" and two.get_ylabel() == ""
    assert _legend(fig) == ["a", "b"]
    # A value past 1 (a perplexity, say) raises the axis; panels per machine are titled with it.
    high = _series("p", {1: _eval_run(1, [(1, 40.0)], metric="perplexity")}, panel="g · cuda")
    low = _series("q", {1: _eval_run(1, [(1, 20.0)], metric="perplexity")}, panel="h · cpu")
    fig = plots.time_to_accuracy_plot("lm", [high, low], "c").figure
    top, bottom = fig.axes
    assert fig.get_suptitle() == "lm: perplexity against wall-clock training time"
    assert (top.get_title(), bottom.get_title()) == ("g · cuda · N = 1", "h · cpu · N = 1")
    assert top.get_ylim() == bottom.get_ylim() == (0, pytest.approx(40.8))
    assert top.get_ylabel() == bottom.get_ylabel() == "perplexity"
    assert top.get_shared_y_axes().joined(top, bottom)
    # No evaluation anywhere: the metric is called accuracy and nothing is drawn.
    plot = plots.time_to_accuracy_plot("cnn", [_series("a", {1: _run(1, 1.0)})], "c")
    assert plot.data == {} and plot.figure.get_suptitle() == "cnn: accuracy against wall-clock training time"


def _stats(step: float) -> dict:
    return {"mean": step * 1.05, "p50": step, "p90": step * 1.2, "min": step * 0.8, "max": step * 1.5,
            "std": 0.0}


def test_step_time_boxes_the_measured_steps_or_ranges_the_statistics():
    steps = [i / 1000 for i in range(1, 22)]          # 1 to 21 ms
    boxed = _series("boxed", {1: _run(1, 1.0, step_time_s=_stats(0.1), step_times_s=steps),
                              4: _run(4, 1.0, step_time_s=_stats(0.2), step_times_s=None)}, hatch="//")
    ranged = _series("ranged", {4: _run(4, 1.0, step_time_s=_stats(0.3))}, color=RED)
    plot = plots.step_time_plot("cnn", [boxed, ranged], "Behind.")
    assert (plot.slug, plot.title) == ("cnn-step-time", "cnn: step-time distribution")
    assert plot.caption == (
        "Boxes: quartiles of the measured steps' times (slowest rank per step), whiskers at the 5th and 95th "
        "percentiles, dots the mean; records without per-step times show min-max and p50-p90. Behind.")
    assert plot.data == {"boxed": [(1, _stats(0.1)), (4, _stats(0.2))], "ranged": [(4, _stats(0.3))]}
    fig = plot.figure
    assert fig.get_suptitle() == "cnn: step time per measured step"
    [ax] = fig.axes
    # Two series: each slot 0.8 wide, 0.4 a series, centred at slot - 0.2 and slot + 0.2.
    [box] = [p for p in ax.patches if type(p).__name__ == "PathPatch"]
    xs = box.get_path().vertices[:, 0]
    assert (xs.min(), xs.max()) == (pytest.approx(-0.2 - 0.14), pytest.approx(-0.2 + 0.14))
    assert box.get_facecolor() == to_rgba(BLUE, 0.5) and box.get_hatch() == "//"
    # Whiskers to the steps within the 5th and 95th percentiles (2 and 20 ms), caps, the median, the rest as dots.
    lines = ax.get_lines()
    assert [[float(v) for v in line.get_ydata()] for line in lines[:5]] == [
        [pytest.approx(6), 2], [pytest.approx(16), 20], [2, 2], [20, 20], [pytest.approx(11)] * 2]
    median, fliers = lines[4:6]
    assert median.get_color() == "black" and list(median.get_xdata()) == [pytest.approx(-0.34), pytest.approx(-0.06)]
    assert list(fliers.get_ydata()) == [1, 21] and (fliers.get_markersize(), fliers.get_markeredgecolor()) == (2, BLUE)
    bars = [p for p in ax.patches if type(p).__name__ == "Rectangle"]
    assert [(b.get_x() + b.get_width() / 2, b.get_y(), b.get_height(), b.get_width()) for b in bars] == [
        (pytest.approx(0.8), pytest.approx(200.0), pytest.approx(40.0), pytest.approx(0.28)),
        (pytest.approx(1.2), pytest.approx(300.0), pytest.approx(60.0), pytest.approx(0.28))]
    assert [b.get_facecolor() for b in bars] == [to_rgba(BLUE, 0.5), to_rgba(RED, 0.5)]
    assert [b.get_edgecolor() for b in bars] == [to_rgba(BLUE, 0.5), to_rgba(RED, 0.5)]
    assert [b.get_hatch() for b in bars] == ["//", ""]
    ranges = [c for c in ax.collections]
    assert [[tuple(map(float, p)) for p in seg] for c in ranges for seg in c.get_segments()] == [
        [(pytest.approx(0.8), pytest.approx(160.0)), (pytest.approx(0.8), pytest.approx(300.0))],
        [(pytest.approx(1.2), pytest.approx(240.0)), (pytest.approx(1.2), pytest.approx(450.0))]]
    assert [tuple(c.get_colors()[0]) for c in ranges] == [to_rgba(BLUE), to_rgba(RED)]
    assert [list(c.get_linewidths()) for c in ranges] == [[1], [1]]
    means = lines[6:]
    assert [_points(m) for m in means] == [[(pytest.approx(-0.2), pytest.approx(105.0))],
                                           [(pytest.approx(0.8), pytest.approx(210.0))],
                                           [(pytest.approx(1.2), pytest.approx(315.0))]]
    assert all((m.get_marker(), m.get_color(), m.get_markersize()) == ("o", "black", 3) for m in means)
    assert list(ax.get_xticks()) == [0, 1] and [t.get_text() for t in ax.get_xticklabels()] == ["N = 1", "N = 4"]
    assert ax.get_xlim() == (-0.6, pytest.approx(1.6)) and ax.get_ylim()[0] == 0
    assert ax.get_ylabel() == "step time (ms)" and ax.get_title() == ""
    assert all(g.get_visible() and g.get_alpha() == 0.3 for g in ax.get_ygridlines())
    assert not any(g.get_visible() for g in ax.get_xgridlines())
    assert _legend(fig) == ["boxed", "ranged"]
    patch = fig.legends[0].legend_handles[0]
    assert patch.get_facecolor() == to_rgba(BLUE, 0.5) and patch.get_hatch() == "//"
    assert patch.get_edgecolor() == to_rgba(BLUE, 0.5)


def test_step_time_keeps_its_colours_and_dots_under_a_matplotlibrc_and_titles_each_machine():
    """Under a matplotlibrc of other colours and without fliers by default, the boxes and their keys keep the
    series' colour and the steps past the whiskers stay dots; a machine's panel is titled with it. 100 steps of
    1 to 100 ms: the whiskers stop at the 5th and 95th percentiles' steps, 6 and 95 ms, the rest are dots."""
    import matplotlib
    from cycler import cycler
    steps = [i / 1000 for i in range(1, 101)]
    gpu = _series("g", {1: _run(1, 1.0, step_time_s=_stats(0.05), step_times_s=steps)}, color=RED,
                  panel="g · cuda")
    cpu = _series("c", {1: _run(1, 1.0, step_time_s=_stats(0.05), step_times_s=steps)}, panel="h · cpu")
    with matplotlib.rc_context({"axes.prop_cycle": cycler(color=["#2ca02c"]), "patch.facecolor": "#2ca02c",
                                "boxplot.showfliers": False}):
        fig = plots.step_time_plot("cnn", [gpu, cpu], "c").figure
    top, bottom = fig.axes
    assert (top.get_title(), bottom.get_title()) == ("g · cuda", "h · cpu")
    [box] = [p for p in top.patches if type(p).__name__ == "PathPatch"]
    assert box.get_facecolor() == to_rgba(RED, 0.5)
    whisker_low, whisker_high, *_, fliers = top.get_lines()[:6]
    assert (whisker_low.get_ydata()[1], whisker_high.get_ydata()[1]) == (6, 95)
    assert list(fliers.get_ydata()) == [1, 2, 3, 4, 5, 96, 97, 98, 99, 100]
    key = fig.legends[0].legend_handles[0]
    assert (key.get_facecolor(), key.get_edgecolor()) == (to_rgba(RED, 0.5), to_rgba(RED, 0.5))


def test_mark_absent_names_in_the_figure_what_has_no_line():
    plot = plots.throughput_plot("cnn", _scaled_pair(), "c")
    assert plots.mark_absent(plot, []) is plot and plot.absent == []
    assert plot.figure.get_suptitle() == "cnn: throughput against devices"
    absent = ["mindspore_auto (3 failed)", "tf_mirrored (1 unsupported)"]
    assert plots.mark_absent(plot, absent) is plot
    assert plot.absent == absent and plot.absent is not absent
    assert plot.figure.get_suptitle() == ("cnn: throughput against devices\nnot drawn, no ok run: "
                                          "mindspore_auto (3 failed); tf_mirrored (1 unsupported)")


def test_overlap_style_narrows_each_later_curve_and_caps_the_widest():
    assert [plots._overlap_style(i, 1) for i in range(1)] == [{"linewidth": 1.2, "markersize": 5, "zorder": 2}]
    assert [plots._overlap_style(i, 3) for i in range(3)] == [
        {"linewidth": pytest.approx(4.8), "markersize": 11.0, "zorder": 2},
        {"linewidth": 3.0, "markersize": 8.0, "zorder": 3},
        {"linewidth": 1.2, "markersize": 5, "zorder": 4}]
    # Eleven curves: 6 points wider at most (10 for markers), in equal steps.
    eleven = [plots._overlap_style(i, 11) for i in range(11)]
    assert eleven[0] == {"linewidth": pytest.approx(7.2), "markersize": pytest.approx(15.0), "zorder": 2}
    assert eleven[9] == {"linewidth": pytest.approx(1.8), "markersize": pytest.approx(6.0), "zorder": 11}
