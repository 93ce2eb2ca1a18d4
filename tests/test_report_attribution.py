"""The report's "where the step goes" section (bench.reporting.attribution): which runs share a row, the newest run
of each backend, the largest gap between two frameworks in words, the table's cells and the bars the figure draws,
all worked by hand from records written here."""
from __future__ import annotations

import pytest
from matplotlib.colors import to_rgba

from bench.reporting.attribution import (
    COLORS,
    attribution_blocks,
    attribution_plot,
    largest_difference,
    latest_profiled,
    row_key,
    row_label,
)
from bench.reporting.document import Heading, Image, Table, Text
from common.attribution import GROUPS
from common.sections import ATTRIBUTION_CATEGORIES


def _record(backend: str, framework: str, seconds: dict[str, float], step_s: float, started: str = "2026-01-01",
            measured: float | None = 0.5, concurrency: float | None = None, **fields) -> dict:
    categories = {c: {"seconds": seconds.get(c, 0.0), "share": seconds.get(c, 0.0) / step_s}
                  for c in ATTRIBUTION_CATEGORIES}
    section = {"step_s": step_s, "wall_step_s": step_s, "measured_step_s": measured, "steps": 2,
               "categories": categories, "profiler": "test", "trace_dir": "/tmp", "op_concurrency": concurrency}
    return {"status": "ok", "backend": backend, "framework": framework, "workload": "mlm", "devices": 2,
            "global_batch": 64, "config": {"model_size": "tiny", "precision": "fp32"}, "started_at": started,
            "layout": {"dp": 2, "tp": 1, "pp": 1}, "backend_metrics": {"attribution": section}, **fields}


TORCH = _record("torch_ddp", "pytorch", {"matmul": 0.5, "softmax": 0.1, "host_idle": 0.4}, 1.0, concurrency=1.5)
TF = _record("tf_mirrored", "tensorflow", {"matmul": 0.8, "softmax": 0.3, "elementwise": 0.3, "all_reduce": 0.2,
                                           "host_idle": 0.4}, 2.0, measured=None)


def test_runs_share_a_row_when_they_did_the_same_work_on_the_same_devices():
    assert row_key(TORCH) == ("mlm", "tiny", "dp2 tp1 pp1", 2, "fp32", 64)
    # the ranks that split the batch: dp x fsdp; a run without a layout is plain dp over its devices
    sharded = {**TORCH, "layout": {"dp": 2, "fsdp": 2, "tp": 3, "pp": 4}, "devices": 48, "precision": "bf16"}
    assert row_key(sharded) == ("mlm", "tiny", "dp4 tp3 pp4", 48, "bf16", 64)
    bare = {"workload": "cnn", "devices": 4, "global_batch": 8}
    assert row_key(bare) == ("cnn", "", "dp4 tp1 pp1", 4, "", 8)
    assert row_label(row_key(TORCH)) == "mlm tiny, dp2 tp1 pp1, N=2, fp32, batch 64"
    assert row_label(("cnn", "tiny", "dp1 tp1 pp1", 1, "fp32", 8)) == "cnn, dp1 tp1 pp1, N=1, fp32, batch 8"
    assert row_label(("mlm", "", "dp1 tp1 pp1", 1, "fp32", 8)) == "mlm, dp1 tp1 pp1, N=1, fp32, batch 8"


def test_each_row_keeps_the_newest_ok_profiled_run_of_each_backend_in_label_order():
    older = _record("torch_ddp", "pytorch", {"matmul": 0.9}, 1.0, started="2025-12-31")
    failed = {**_record("torch_ddp", "pytorch", {"matmul": 0.1}, 1.0, started="2026-02-01"), "status": "failed"}
    unprofiled = {**TORCH, "started_at": "2026-03-01", "backend_metrics": {}}
    unstamped = {**_record("tf_mirrored", "tensorflow", {"matmul": 0.9}, 1.0), "started_at": None}
    cnn = {**_record("torch_ddp", "pytorch", {"matmul": 0.2}, 1.0), "workload": "cnn"}
    rows = latest_profiled([TORCH, older, failed, unprofiled, TF, unstamped, cnn])
    assert list(rows) == [row_key(cnn), row_key(TORCH)]  # "cnn, ..." before "mlm tiny, ..."
    assert rows[row_key(TORCH)] == {"torch_ddp": TORCH, "tf_mirrored": TF}
    assert list(rows[row_key(TORCH)]) == ["tf_mirrored", "torch_ddp"]  # the unstamped run is the oldest
    # rows in the order of their labels, not of their keys: "mlm tiny, ..." sorts before "mlm, ..." (a blank
    # before a comma) where the key of a run without a model size, ("mlm", "", ...), sorts first
    unsized = {**TORCH, "config": {"precision": "fp32"}}
    assert list(latest_profiled([unsized, TORCH])) == [row_key(TORCH), row_key(unsized)]


def test_the_largest_gap_between_two_frameworks_is_said_with_both_sides_figures():
    # groups (torch, tf): matmul 0.5 / 0.8, other compute 0.1 / 0.6, communication 0 / 0.2, host/idle 0.4 / 0.4
    assert largest_difference({"torch_ddp": TORCH, "tf_mirrored": TF}) == (
        "other compute: 600 ms per step in tf_mirrored (tensorflow, 30% of its 2000 ms step) against 100 ms in "
        "torch_ddp (pytorch, 10% of 1000 ms), a difference of 500 ms where the two steps differ by +1000 ms")
    # the slower side is the one with more of the group, whichever step is longer
    quick = _record("tf_mirrored", "tensorflow", {"matmul": 0.1, "host_idle": 0.9}, 0.5)
    assert largest_difference({"torch_ddp": TORCH, "tf_mirrored": quick}) == (
        "host/idle: 900 ms per step in tf_mirrored (tensorflow, 180% of its 500 ms step) against 400 ms in "
        "torch_ddp (pytorch, 40% of 1000 ms), a difference of 500 ms where the two steps differ by -500 ms")
    same = _record("torch_dp", "pytorch", {"matmul": 0.9}, 2.0)
    assert largest_difference({"torch_ddp": TORCH, "torch_dp": same}) is None
    assert largest_difference({"torch_ddp": TORCH}) is None
    # a tie keeps the first group found
    one = _record("torch_ddp", "pytorch", {"matmul": 0.5, "host_idle": 0.25}, 1.0)
    other = _record("tf_mirrored", "tensorflow", {"matmul": 0.25, "host_idle": 0.5}, 1.0)
    assert largest_difference({"torch_ddp": one, "tf_mirrored": other}).startswith("matmul: 500 ms per step in torch")


def test_the_gap_skips_a_pair_of_one_framework_and_goes_on_to_the_next():
    """Sorted by backend, (a_torch, b_torch) is one framework's pair and comes first: it is skipped, not the end.
    Steps of 2.5 s and 0.5 s and sub-second groups make every ms and share figure its own."""
    fast = _record("a_torch", "pytorch", {"matmul": 0.9, "host_idle": 0.3}, 2.5)
    same = _record("b_torch", "pytorch", {"matmul": 0.1}, 0.5)
    slow = _record("c_tf", "tensorflow", {"matmul": 0.2, "softmax": 0.9}, 1.3)
    # other compute: 0, 0, 0.9; matmul 0.9, 0.1, 0.2: the largest is a_torch against c_tf's other compute (0.9)
    assert largest_difference({"a_torch": fast, "b_torch": same, "c_tf": slow}) == (
        "other compute: 900 ms per step in c_tf (tensorflow, 69% of its 1300 ms step) against 0 ms in a_torch "
        "(pytorch, 0% of 2500 ms), a difference of 900 ms where the two steps differ by -1200 ms")
    long = _record("a_torch", "pytorch", {"matmul": 1.4, "host_idle": 0.3}, 2.5)
    matmul = _record("c_tf", "tensorflow", {"matmul": 0.6, "host_idle": 0.3}, 1.3)
    assert largest_difference({"a_torch": long, "c_tf": matmul}) == (
        "matmul: 1400 ms per step in a_torch (pytorch, 56% of its 2500 ms step) against 600 ms in c_tf "
        "(tensorflow, 46% of 1300 ms), a difference of 800 ms where the two steps differ by +1200 ms")


def test_the_figure_stacks_each_backend_s_shares_by_group_with_its_step_at_the_end():
    rows = latest_profiled([TORCH, TF])
    plot = attribution_plot(rows)
    # a row's backends in the order they ran (the two started at once: the order given)
    labels = ["mlm tiny, dp2 tp1 pp1, N=2, fp32, batch 64 · torch_ddp",
              "mlm tiny, dp2 tp1 pp1, N=2, fp32, batch 64 · tf_mirrored"]
    assert plot.data == {"matmul": list(zip(labels, [0.5, 0.4])), "attention": list(zip(labels, [0.0, 0.0])),
                         "other compute": list(zip(labels, [0.1, pytest.approx(0.3)])),
                         "communication": list(zip(labels, [0.0, 0.1])), "data movement": list(zip(labels, [0, 0])),
                         "host/idle": list(zip(labels, [0.4, 0.2])), "other": list(zip(labels, [0, 0]))}
    assert (plot.slug, plot.title) == ("attribution", "Where the step goes")
    assert plot.caption == (
        "Each bar: one backend's profiled steps (after its measured window), op time from the framework's own "
        "profiler split into categories (docs/profiling.md); host/idle is time no op ran. The figure at the end is "
        "the profiled step in ms.")
    fig = plot.figure
    ax = fig.axes[0]
    assert list(fig.get_size_inches()) == [11, 1.6 + 0.45 * 2]
    assert fig._suptitle.get_text() == "Where the step goes (--profile): share of the step by op category"
    # bar by bar, group by group: where each starts, how wide, its colour
    bars = [(p.get_y() + p.get_height() / 2, p.get_x(), p.get_width(), p.get_facecolor()) for p in ax.patches]
    expected, left = [], [0.0, 0.0]
    for group in GROUPS:
        for i, (_, share) in enumerate(plot.data[group]):
            expected.append((i, left[i], share, to_rgba(COLORS[group])))
            left[i] += share
    assert bars == [(y, pytest.approx(x), pytest.approx(w), c) for y, x, w, c in expected]
    assert [(t.get_text(), t.get_position()) for t in ax.texts] == [("1000 ms", (pytest.approx(1.01), 0)),
                                                                    ("2000 ms", (pytest.approx(1.01), 1))]
    assert [t.get_text() for t in ax.get_yticklabels()] == labels and ax.yaxis_inverted()
    assert ax.get_xlim() == (0, 1.15) and ax.get_xlabel() == "share of the profiled step"
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == list(GROUPS) and legend._ncols == 4
    # the legend above the bars, small and unframed; the step's ms beside its bar, centred on it; small labels
    assert (legend._loc, legend.get_frame_on(), legend.get_texts()[0].get_fontsize()) == (8, False, 8)
    assert tuple(legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).p0) == (0.5, 1.0)
    assert {(t.get_fontsize(), t.get_va()) for t in ax.texts} == {(8, "center")}
    assert {t.get_fontsize() for t in ax.get_yticklabels()} == {8}
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"


def test_the_table_gives_each_group_s_ms_and_share_and_the_words_follow_the_figure():
    blocks = attribution_blocks([TORCH, TF])
    assert blocks[:2] == [Heading("Where the step goes, by op category", 2), Text(
        "From --profile: ms per step (share of the profiled step) by category group, from each framework's own "
        "profiler over a few steps after the measured window; 'measured step' is the timed window's median, without "
        "the profiler; 'ops at once': how many threads ran an op at a time, on average while any did (a framework "
        "that runs independent ops side by side uses more cores than its threads per device). The categories and "
        "how each framework's op names map to them: docs/profiling.md.")]
    label = "mlm tiny, dp2 tp1 pp1, N=2, fp32, batch 64"
    assert blocks[2] == Table(
        ["row", "backend", "matmul ms", "attention ms", "other compute ms", "communication ms", "data movement ms",
         "host/idle ms", "other ms", "profiled step ms", "measured step ms", "ops at once"],
        [[label, "torch_ddp", "500 (50%)", "0 (0%)", "100 (10%)", "0 (0%)", "0 (0%)", "400 (40%)", "0 (0%)",
          "1000", "500", "1.50"],
         [label, "tf_mirrored", "800 (40%)", "0 (0%)", "600 (30%)", "200 (10%)", "0 (0%)", "400 (20%)", "0 (0%)",
          "2000", "", ""]])
    image = blocks[3]
    assert isinstance(image, Image) and (image.path, image.title) == ("plots/attribution.png", "Where the step goes")
    assert image.caption == attribution_plot(latest_profiled([TORCH, TF])).caption
    assert blocks[4:] == [Text("Largest difference between two frameworks on a row: " + label + ": "
                               + largest_difference({"torch_ddp": TORCH, "tf_mirrored": TF}) + ".")]
    # two rows, each with its gap: one sentence per row, after one another; a measured step of 0.9 s is 900 ms
    cnn_torch = {**_record("torch_ddp", "pytorch", {"matmul": 0.3}, 1.0, measured=0.9), "workload": "cnn"}
    cnn_tf = {**_record("tf_mirrored", "tensorflow", {"matmul": 0.7}, 1.0), "workload": "cnn"}
    blocks = attribution_blocks([TORCH, TF, cnn_torch, cnn_tf])
    cnn = row_label(row_key(cnn_torch))
    assert [r[-2] for r in blocks[2].rows if r[:2] == [cnn, "torch_ddp"]] == ["900"]
    assert blocks[4:] == [Text("Largest difference between two frameworks on a row: " + cnn + ": "
                               + largest_difference({"torch_ddp": cnn_torch, "tf_mirrored": cnn_tf}) + ". " + label
                               + ": " + largest_difference({"torch_ddp": TORCH, "tf_mirrored": TF}) + ".")]
    # one framework alone: no words
    assert not any(isinstance(b, Text) and "Largest" in b.text for b in attribution_blocks([TORCH]))
    assert attribution_blocks([{**TORCH, "backend_metrics": None}]) == []
