"""The report's repeats and baseline sections (bench.reporting.comparison), held to figures worked by hand: runs
with constant step times, so every interval is its point and every ratio a fraction of two step times."""
from __future__ import annotations

import pandas as pd
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import ConstrainedLayoutEngine

from bench.reporting.comparison import baseline_section, regressions, repeats_section
from bench.reporting.document import Heading, Image, Table, Text


def _run(backend: str, devices: int, step: float, i: int, workload: str = "mlm", host: str = "a",
         curve=((1, 10.0), (2, 9.0)), status: str = "ok", sweep: str = "sweep-x", load: float = 0.3) -> dict:
    """An ok weak-scaling run (32 samples per device a step) whose every step took `step` seconds."""
    return {"run_id": f"{backend}-{workload}-{devices}-{host}-{i}", "status": status, "workload": workload,
            "backend": backend, "strategy": backend, "devices": devices, "device_kind": "cpu", "scaling": "weak",
            "global_batch": 32 * devices, "per_device_batch": 32, "data": "synthetic",
            "config": {"precision": "fp32", "model_size": "tiny"}, "sweep_id": sweep,
            "started_at": f"2026-11-2{i % 10}T10:00:00+00:00",
            "layout": {"dp": devices, "tp": 1, "pp": 1, "micro_batches": 1, "schedule": "gpipe", "fsdp": 1,
                       "recompute": "none", "vocab_split": False},
            "step_times_s": [step] * 6, "host": {"name": host, "cores": 2},
            "load": {"loadavg_1m_before": load, "cpu_steal_share": 0.0},
            "loss": {"curve": [list(p) for p in curve]} if curve is not None else {}}


def _table(blocks) -> Table:
    (table,) = [b for b in blocks if isinstance(b, Table)]
    return table


def test_repeats_rank_each_workload_and_count_its_runs_sweeps_and_busy_ones():
    # torch_ddp 1 device: 32 / 0.32 = 100 samples/s; 2 devices: 64 / 0.4 = 160, efficiency 160 / (2 x 100) = 0.80.
    # tf_mirrored 1 device: 32 / 0.4 = 80, 0.80x of the fastest (intervals of constant steps never overlap).
    records = [_run("torch_ddp", 1, 0.32, 1), _run("torch_ddp", 1, 0.32, 2, sweep="sweep-y", load=3.5),
               _run("torch_ddp", 2, 0.4, 3), _run("torch_ddp", 2, 0.4, 4),
               _run("tf_mirrored", 1, 0.4, 5), _run("tf_mirrored", 1, 0.4, 6),
               _run("tf_mirrored", 2, 0.5, 7),  # one run: no interval, left out of the table but not of the labels
               _run("torch_ddp", 1, 0.5, 8, workload="cnn"), _run("torch_ddp", 1, 0.5, 9, workload="cnn")]
    blocks, plots = repeats_section(records)
    assert blocks[0] == Heading("Repeated rows: medians and 95% intervals", 2)
    assert blocks[1] == Text(
        "A row is one configuration at one device count, its runs the repeats within a sweep and the runs of the "
        "same configuration in other sweeps. Each row's figure is the median over its runs; the interval is a "
        "two-level bootstrap (runs, then each run's step times), so it holds the drift between runs. Rows of one "
        "workload and device count whose intervals overlap the fastest row's are marked *no difference* instead of "
        "ranked. Busy runs started on a machine with more than 1.5 runnable processes per core or lost more than 5% "
        "of CPU time to steal.")
    table = _table(blocks)
    assert table.columns == ["workload", "row", "runs", "sweeps", "busy runs", "samples/s [95%]",
                             "efficiency [95%]", "vs fastest of its N"]
    assert table.rows == [
        ["cnn", "torch_ddp N=1", "2", "1", "0", "64.0 [64.0, 64.0]", "1.00 [1.00, 1.00]", "fastest"],
        ["mlm", "torch_ddp N=1", "2", "2", "1", "100.0 [100.0, 100.0]", "1.00 [1.00, 1.00]", "fastest"],
        ["mlm", "tf_mirrored N=1", "2", "1", "0", "80.0 [80.0, 80.0]", "1.00 [1.00, 1.00]", "0.80x"],
        ["mlm", "torch_ddp N=2", "2", "1", "0", "160.0 [160.0, 160.0]", "0.80 [0.80, 0.80]", "fastest"]]
    assert [p.slug for p in plots] == ["cnn-repeats", "mlm-repeats"]
    mlm = plots[1]
    assert mlm.title == "mlm: throughput over repeated runs"
    assert mlm.caption == "Error bars: 95% intervals over the row's runs and their steps."
    # Drawn by device count, then speed: [low, median, high] per row.
    assert list(mlm.data.items()) == [("tf_mirrored N=1", [80.0, 80.0, 80.0]),
                                      ("torch_ddp N=1", [100.0, 100.0, 100.0]),
                                      ("torch_ddp N=2", [160.0, 160.0, 160.0])]
    ax = mlm.figure.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(mlm.data)
    assert ax.get_xlabel() == "samples/s (median of runs, 95% interval)" and ax.get_title() == mlm.title
    assert list(ax.lines[0].get_xdata()) == [80.0, 100.0, 160.0] and list(ax.lines[0].get_ydata()) == [0, 1, 2]
    assert (ax.lines[0].get_marker(), ax.lines[0].get_linestyle()) == ("o", "None")   # dots, no line joining rows
    assert list(mlm.figure.get_size_inches()) == [8, 0.9 + 0.35 * 3]
    assert ax.lines[1].get_markersize() == 2 * 4  # caps of 4 points at both ends of each bar
    assert isinstance(mlm.figure.get_layout_engine(), ConstrainedLayoutEngine)
    # each error bar spans the row's interval: low to high around the median
    assert [list(seg[:, 0]) for seg in ax.collections[0].get_segments()] == [[80.0, 80.0], [100.0, 100.0],
                                                                           [160.0, 160.0]]
    images = [b for b in blocks if isinstance(b, Image)]
    assert [(i.path, i.title, i.caption) for i in images] == [(f"plots/{p.slug}.png", p.title, p.caption)
                                                               for p in plots]
    assert images[0].png.startswith(b"\x89PNG")


def test_repeats_with_noisy_steps_give_their_interval_and_no_rank_inside_it():
    noisy = [_run("torch_ddp", 1, 0.32, i) for i in range(3)] + [_run("tf_mirrored", 1, 0.32, 5 + i) for i in range(2)]
    for n, r in enumerate(noisy):
        r["step_times_s"] = [0.30 + 0.01 * ((k + n) % 5) for k in range(6)]
    table = _table(repeats_section(noisy)[0])
    assert [row[-1] for row in table.rows] == ["fastest", "no difference"]
    low, high = table.rows[0][5].split(" [")[1].rstrip("]").split(", ")
    assert float(low) < float(table.rows[0][5].split(" ")[0]) < float(high)


def test_repeats_without_a_repeated_row_or_without_a_one_device_run_say_so():
    assert repeats_section([_run("torch_ddp", 1, 0.32, 1)]) == ([], [])
    # No 1-device row to hold the 2-device row against: its efficiency cell is empty.
    table = _table(repeats_section([_run("torch_ddp", 2, 0.4, 1), _run("torch_ddp", 2, 0.4, 2)])[0])
    assert table.rows == [["mlm", "torch_ddp N=2", "2", "1", "0", "160.0 [160.0, 160.0]", "", "fastest"]]


def test_a_baseline_with_no_row_in_common_says_so_and_has_no_figure():
    blocks, plots, frame = baseline_section([_run("torch_ddp", 1, 0.32, 1)], [_run("torch_ddp", 2, 0.4, 2)], "B")
    assert blocks == [Heading("Against the baseline B", 2),
                      Text("The two folders have no row in common (same workload, backend, layout, devices, "
                           "scaling, global batch, precision, model size and data).")]
    assert plots == [] and frame.empty


def test_the_baseline_table_holds_each_common_row_its_ratio_and_verdict():
    # Here: torch_ddp 100 samples/s (0.32 s), tf_mirrored 80 (0.4 s). Baseline, on another host: 80 and 80.
    here = [_run("torch_ddp", 1, 0.32, 1), _run("torch_ddp", 1, 0.32, 2), _run("tf_mirrored", 1, 0.4, 3),
            _run("torch_ddp", 2, 0.4, 4)]  # no baseline run of 2 devices: not compared
    base = [_run("torch_ddp", 1, 0.4, 5, host="b"), _run("tf_mirrored", 1, 0.4, 6, host="b")]
    blocks, plots, frame = baseline_section(here, base, "B")
    assert blocks[:2] == [Heading("Against the baseline B", 2), Text(
        "Ratio = samples/s here over samples/s in the baseline, with its 95% interval (each folder's runs "
        "bootstrapped on their own). *slower*/*faster*: the whole interval lies below/above 1; otherwise *no "
        "difference*.")]
    table = _table(blocks)
    assert table.columns == ["workload", "row", "runs (here / baseline)", "samples/s here", "baseline",
                             "ratio [95%]", "verdict"]
    assert table.rows == [["mlm", "tf_mirrored N=1", "1 / 1", "80.0", "80.0", "1.000 [1.000, 1.000]", "no difference"],
                          ["mlm", "torch_ddp N=1", "2 / 1", "100.0", "80.0", "1.250 [1.250, 1.250]", "faster"]]
    assert frame.verdict.tolist() == ["no difference", "faster"]
    assert [p.slug for p in plots] == ["mlm-baseline-loss"]


def test_the_loss_overlay_draws_each_common_row_once_solid_here_and_dashed_in_the_baseline():
    here = [_run("torch_ddp", 1, 0.32, 1, curve=[(1, 5.0), (2, 4.0)]),
            _run("torch_ddp", 1, 0.32, 2, curve=[(1, 7.0), (2, 6.0)]),        # a repeat: the first run stands
            _run("tf_mirrored", 1, 0.4, 3, curve=None),                       # no curve: nothing drawn
            _run("torch_ddp", 1, 0.32, 4, workload="cnn", curve=[(1, 2.0)]),  # another workload's figure
            _run("torch_ddp", 2, 0.4, 5, curve=[(1, 3.0)])]                   # not in the baseline
    base = [_run("torch_ddp", 1, 0.5, 9, workload="cnn", curve=[(1, 2.5)]),
            _run("torch_ddp", 1, 0.4, 6, host="b", curve=[(1, 5.5), (3, 4.5)]),
            _run("torch_ddp", 1, 0.4, 10, host="b", curve=[(1, 8.0)]),
            _run("torch_ddp", 1, 0.4, 7, host="b", status="failed", curve=[(1, 9.0)]),
            _run("tf_mirrored", 1, 0.4, 8, host="b", curve=[(1, 1.0)])]
    blocks, plots, _ = baseline_section(here, base, "B")
    assert [p.slug for p in plots] == ["cnn-baseline-loss", "mlm-baseline-loss"]
    cnn, mlm = plots
    assert cnn.data == {"torch_ddp N=1 (here)": [(1, 2.0)], "torch_ddp N=1 (B)": [(1, 2.5)]}
    assert list(mlm.data.items()) == [("torch_ddp N=1 (here)", [(1, 5.0), (2, 4.0)]),
                                      ("torch_ddp N=1 (B)", [(1, 5.5), (3, 4.5)]), ("tf_mirrored N=1 (B)", [(1, 1.0)])]
    assert mlm.title == "mlm: loss here and in the baseline"
    assert mlm.caption == "Solid: this folder; dashed: B."
    ax = mlm.figure.axes[0]
    assert [(line.get_label(), line.get_linestyle(), list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()] == [("torch_ddp N=1 (here)", "-", [1, 2], [5.0, 4.0]),
                                            ("torch_ddp N=1 (B)", "--", [1, 3], [5.5, 4.5]),
                                            ("tf_mirrored N=1 (B)", "--", [1], [1.0])]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(mlm.data)
    assert ax.get_legend()._fontsize == FontProperties(size="small").get_size_in_points()
    assert isinstance(mlm.figure.get_layout_engine(), ConstrainedLayoutEngine)
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("step", "training loss (global mean)", mlm.title)
    assert list(mlm.figure.get_size_inches()) == [8, 4.5]
    images = [b for b in blocks if isinstance(b, Image)]
    assert [(i.path, i.title, i.caption) for i in images] == [(f"plots/{p.slug}.png", p.title, p.caption)
                                                               for p in plots]
    assert all(i.png.startswith(b"\x89PNG") for i in images)


def test_only_rows_slower_beyond_the_noise_and_the_allowance_are_regressions():
    frame = pd.DataFrame({"verdict": ["slower", "slower", "faster", "no difference", "slower"],
                          "ratio_high": [0.70, 0.95, 1.30, 0.99, 0.90]})
    assert regressions(frame).index.tolist() == [0, 1, 4]
    assert regressions(frame, 0.1).index.tolist() == [0]          # 0.90 is not below 1 - 0.1
    assert regressions(frame, 0.05).index.tolist() == [0, 4]
    empty = pd.DataFrame(columns=["verdict", "ratio_high"])
    assert regressions(empty, 0.1) is empty
