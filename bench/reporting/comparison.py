"""The report's sections for rows measured several times, and for a results folder against a baseline folder.

Repeats: each row's median samples/s and efficiency with their 95% intervals, 'no difference' where a row's
interval overlaps the fastest row's of its workload and device count, and a figure with the intervals as error
bars. Baseline: the rows both folders measured, this folder over the baseline with the ratio's interval,
'slower'/'faster' only beyond the noise (and the allowance), and the loss curves of the two overlaid.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.intervals import BASELINE_IGNORES, baseline_frame, interval_frame, ranked, row_key
from bench.reporting.keys import row_labels
from bench.reporting.plots import Plot


def _labels(frame: pd.DataFrame) -> dict:
    """Per (key, devices) of the frame: the backend, the key fields that tell its rows apart, and N."""
    keys = list(dict.fromkeys(frame.key))
    names = dict(zip(keys, row_labels(keys)))
    return {(k, n): f"{names[k]} N={n}" for k, n in zip(frame.key, frame.devices)}


def repeats_section(records: list[dict]) -> tuple[list[Block], list[Plot]]:
    """Only rows with more than one ok run: one run has no interval to show."""
    frame = interval_frame(records)
    labels = _labels(frame)  # told apart from every row measured, repeated or not
    frame = frame[frame.runs > 1]
    if frame.empty:
        return [], []
    blocks: list[Block] = [Heading("Repeated rows: medians and 95% intervals", 2), Text(
        "A row is one configuration at one device count, its runs the repeats within a sweep and the runs of the "
        "same configuration in other sweeps. "
        "Each row's figure is the median over its runs; the interval is a two-level bootstrap (runs, then each "
        "run's step times), so it holds the drift between runs. Rows of one workload and device count whose "
        "intervals overlap the fastest row's are marked *no difference* instead of ranked. Busy runs started on "
        "a machine with more than 1.5 runnable processes per core or lost more than 5% of CPU time to steal.")]
    rows, plots = [], []
    for row in ranked(frame).itertuples():
        eff = ("" if pd.isna(row.efficiency) else
               f"{row.efficiency:.2f} [{row.efficiency_low:.2f}, {row.efficiency_high:.2f}]")
        rows.append([row.workload, labels[row.key, row.devices], str(row.runs), str(row.sweeps), str(row.busy_runs),
                     f"{row.samples_per_s:.1f} [{row.samples_per_s_low:.1f}, {row.samples_per_s_high:.1f}]",
                     eff, row.vs_fastest])
    blocks.append(Table(["workload", "row", "runs", "sweeps", "busy runs", "samples/s [95%]", "efficiency [95%]",
                         "vs fastest of its N"], rows))
    for workload, group in frame.groupby("workload", sort=True):
        plot = _interval_plot(workload, group, labels)
        plots.append(plot)
        blocks.append(Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png()))
    return blocks, plots


def _interval_plot(workload: str, frame: pd.DataFrame, names: dict) -> Plot:
    fig = Figure(figsize=(8, 0.9 + 0.35 * len(frame)), layout="constrained")
    ax = fig.subplots()
    ordered = frame.sort_values(["devices", "samples_per_s"])
    labels = [names[r.key, r.devices] for r in ordered.itertuples()]
    low = ordered.samples_per_s - ordered.samples_per_s_low
    high = ordered.samples_per_s_high - ordered.samples_per_s
    ax.errorbar(ordered.samples_per_s, range(len(ordered)), xerr=[low, high], fmt="o", capsize=4)
    ax.set_yticks(range(len(ordered)), labels)
    ax.set_xlabel("samples/s (median of runs, 95% interval)")
    title = f"{workload}: throughput over repeated runs"
    ax.set_title(title)
    data = {label: [r.samples_per_s_low, r.samples_per_s, r.samples_per_s_high]
            for label, r in zip(labels, ordered.itertuples())}
    return Plot(f"{workload}-repeats", title, "Error bars: 95% intervals over the row's runs and their steps.",
                fig, data)


def baseline_section(records: list[dict], baseline: list[dict], baseline_name: str
                     ) -> tuple[list[Block], list[Plot], pd.DataFrame]:
    """The comparison against `baseline`, its loss figures, and the frame (for the exit status)."""
    frame = baseline_frame(records, baseline)
    blocks: list[Block] = [Heading(f"Against the baseline {baseline_name}", 2)]
    if frame.empty:
        return blocks + [Text("The two folders have no row in common (same workload, backend, layout, devices, "
                              "scaling, global batch, precision, model size and data).")], [], frame
    blocks.append(Text(
        "Ratio = samples/s here over samples/s in the baseline, with its 95% interval (each folder's runs "
        "bootstrapped on their own). *slower*/*faster*: the whole interval lies below/above 1; otherwise *no "
        "difference*."))
    labels = _labels(frame)
    blocks.append(Table(["workload", "row", "runs (here / baseline)", "samples/s here", "baseline",
                         "ratio [95%]", "verdict"],
                        [[r.workload, labels[r.key, r.devices], f"{r.runs} / {r.baseline_runs}",
                          f"{r.samples_per_s:.1f}",
                          f"{r.baseline_samples_per_s:.1f}", f"{r.ratio:.3f} [{r.ratio_low:.3f}, {r.ratio_high:.3f}]",
                          r.verdict] for r in frame.itertuples()]))
    plots = []
    for workload in sorted(frame.workload.unique()):
        plot = _loss_overlay(workload, frame[frame.workload == workload], records, baseline, baseline_name, labels)
        plots.append(plot)
        blocks.append(Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png()))
    return blocks, plots, frame


def _loss_overlay(workload: str, frame: pd.DataFrame, records: list[dict], baseline: list[dict],
                  baseline_name: str, names: dict) -> Plot:
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    data = {}
    for source, runs, style in (("here", records, "-"), (baseline_name, baseline, "--")):
        for r in runs:
            if r.get("status") != "ok" or not (r.get("loss") or {}).get("curve"):
                continue
            key, devices = row_key(r)
            row = key.without(*BASELINE_IGNORES), devices
            if row not in names or row[0].workload != workload:
                continue
            steps, losses = zip(*r["loss"]["curve"])
            label = f"{names[row]} ({source})"
            if label in data:  # the first run of a row stands for its repeats: the same data, the same curve
                continue
            ax.plot(steps, losses, style, label=label)
            data[label] = list(zip(steps, losses))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global mean)")
    title = f"{workload}: loss here and in the baseline"
    ax.set_title(title)
    ax.legend(fontsize="small")
    return Plot(f"{workload}-baseline-loss", title, f"Solid: this folder; dashed: {baseline_name}.", fig, data)


def regressions(frame: pd.DataFrame, allowance: float = 0.0) -> pd.DataFrame:
    """The rows slower than the baseline beyond the noise and by more than `allowance` (a fraction)."""
    if frame.empty:
        return frame
    return frame[(frame.verdict == "slower") & (frame.ratio_high < 1 - allowance)]
