"""From run records to the report's blocks: a header naming what is behind the numbers and the sweeps, then per
workload its table and figures."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from bench.reporting.attribution import attribution_blocks
from bench.reporting.calibration import breakdown_blocks, calibration_blocks
from bench.reporting.comparison import repeats_section
from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.keys import describe_sweep
from bench.reporting.layout_plot import layout_plot
from bench.reporting.layouts import in_layout_table, layout_frame, layout_table
from bench.reporting.plan import plan_blocks
from bench.reporting.plots import PLOTTERS, Plot, mark_absent
from bench.reporting.published_plot import published_blocks
from bench.reporting.series import DATA_NAMES, Series, build_series, describe_lines
from bench.reporting.sweeps import sweep_ids, sweep_index
from bench.reporting.tables import workload_table
from bench.reporting.validation import validation_blocks
from common.config_key import NO_REFERENCE
from common.results import STATUSES, summary_frame


def _join(values) -> str:
    return ", ".join(sorted({str(v) for v in values if v not in (None, "")})) or "unknown"


def _hardware(records: list[dict]) -> Table:
    rows = {}
    for r in records:
        host = r.get("host") or {}
        row = rows.setdefault(host.get("name"), {"host": host, "kinds": set(), "described": set()})
        if r.get("device_kind"):
            row["kinds"].add(f"{r['device_kind']}{' (virtual)' if r.get('virtual') else ''}")
        row["described"].add(r.get("devices_description"))
    body = [[str(name), str(v["host"].get("cpu", "")), str(v["host"].get("cores", "")),
             _join(v["host"].get("gpus") or []) if v["host"].get("gpus") else "none",
             str(v["host"].get("os", "")), str(v["host"].get("python", "")), _join(v["kinds"]),
             "; ".join(sorted(d for d in v["described"] if d))]
            for name, v in sorted(rows.items(), key=lambda kv: str(kv[0]))]
    return Table(["host", "CPU", "cores", "GPUs", "OS", "Python", "device kinds", "devices used"], body)


def _software(records: list[dict]) -> Table:
    seen = set()
    for r in records:
        packages = ", ".join(f"{k} {v}" for k, v in sorted((r.get("versions") or {}).items()))
        seen.add((str((r.get("host") or {}).get("name")), r["backend"],
                  f"{r.get('framework') or ''} {r.get('framework_version') or ''}".strip() or "not started",
                  str(r.get("git_sha")), packages))
    return Table(["host", "backend", "framework", "parbench commit", "packages"], [list(row) for row in sorted(seen)])


def _data(records: list[dict]) -> Table:
    counts: dict[tuple, int] = {}
    for r in records:
        key = (r["workload"], DATA_NAMES.get(r["workload"], "?"), str(r.get("data") or "unknown"))
        counts[key] = counts.get(key, 0) + 1
    return Table(["workload", "dataset", "data", "runs"], [[*key, str(n)] for key, n in sorted(counts.items())])


def header(records: list[dict], results: str, filters: str, skipped: int, folder: list[dict]) -> list[Block]:
    statuses = pd.Series([r["status"] for r in records]).value_counts()
    counts = ", ".join(f"{statuses.get(s, 0)} {s}" for s in STATUSES)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    intro = f"Generated {generated} from {len(records)} run records in `{results}/runs` ({counts})."
    if filters:
        intro += f" Filters: {filters}."
    if skipped:
        intro += f" {skipped} file(s) in `runs/` skipped: not a valid run record."
    return [
        Heading("parbench report", 1), Text(intro),
        Text("A configuration is everything a run was asked to do but its device count: backend, strategy or "
             "mode, workload, model size, precision, batch (per device under weak scaling, global under strong), "
             "micro-batches, layout and its options, compile mode, data, device kind, host, threads per device "
             "and scaling mode. Scaling efficiency is samples/s(N) / (N x samples/s(1)) against the latest ok "
             "1-device run of the same configuration in the same sweep (a layout that splits the model: of its "
             f"global batch and micro-batches on one device); where there is none the cell says \"{NO_REFERENCE}\". "
             "A table row is the latest run of a configuration and device count in its sweep; a line in a figure "
             "joins the runs of one configuration in one sweep."),
        Heading("Sweeps", 2),
        Text("Every sweep of the folder; `bench.report --sweep ID` reports one." + (
            " This report: " + ", ".join(describe_sweep(s) for s in sweep_ids(records)) + "."
            if len(sweep_ids(folder)) > 1 and filters else "")),
        sweep_index(folder),
        Heading("Hardware", 2), _hardware(records),
        Heading("Software", 2), _software(records),
        Heading("Data", 2), _data(records),
    ]


def figure_caption(workload: str, series: list[Series]) -> str:
    """What is behind a figure: the data and framework versions of its lines, and what they share (the
    legend names what tells them apart)."""
    runs = [r for s in series for r in s.runs.values()]
    data = _join(f"{r.get('data')} {DATA_NAMES.get(workload, '')}".strip() for r in runs)
    frameworks = _join(f"{r.get('framework')} {r.get('framework_version')}" for r in runs)
    shared = describe_lines(series)
    return f"Data: {data}. Frameworks: {frameworks}." + (f" {shared}" if shared else "")


def absent_backends(frame: pd.DataFrame, workload: str, series: list[Series]) -> list[str]:
    """Backends of this workload with no ok run and so no line in its figures, each with its runs' statuses
    (one whose ok runs are all in layout sweeps is drawn in the layout figure instead)."""
    drawn = {s.key.backend for s in series}
    rows = frame[(frame.workload == workload) & ~frame.backend.isin(drawn)]
    return [f"{backend} ({', '.join(f'{n} {status}' for status, n in group.status.value_counts().items())})"
            for backend, group in rows.groupby("backend") if not (group.status == "ok").any()]


def workload_section(workload: str, frame: pd.DataFrame, records_by_id: dict[str, dict],
                     series: list[Series]) -> tuple[list[Block], list[Plot]]:
    above, columns, rows = workload_table(frame, records_by_id, workload)
    blocks: list[Block] = [Heading(f"Workload `{workload}`", 2), *([Text(above)] if above else []),
                           Table(columns, rows)]
    if not series:
        return blocks + [Text("No ok run with measured steps (outside layout sweeps): nothing to plot against "
                              "devices.")], []
    absent = absent_backends(frame, workload, series)
    caption = figure_caption(workload, series)
    if absent:
        caption += f" Not drawn, no ok run: {'; '.join(absent)}."
    plots = []
    for plotter in PLOTTERS:
        plot = mark_absent(plotter(workload, series, caption), absent)
        if not plot.data:
            continue  # e.g. records without an eval_history: an empty frame helps no one
        blocks.append(Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png()))
        plots.append(plot)
    return blocks, plots


def layout_section(workload: str, frame: pd.DataFrame, records_by_id: dict[str, dict]
                   ) -> tuple[list[Block], list[Plot]]:
    """The layout table and figure of one workload; nothing when it has no layout runs."""
    columns, rows = layout_table(frame, records_by_id, workload)
    if not rows:
        return [], []
    blocks: list[Block] = [
        Heading(f"Layouts of `{workload}`", 3),
        Text("Each layout trains the same global batch; efficiency is samples/s / (N x samples/s of the 1-device "
             "run of the same global batch and micro-batches). Memory per rank is each process's measured peak; "
             "params+grads+optimizer is counted from the shards each rank holds. The analytic bubble is "
             "(stages - 1) / (micro-batches + stages - 1), the measured one each stage's idle share of a step. "
             "Communication is bytes per step per rank of the collectives issued, by kind."),
        Table(columns, rows)]
    shown = frame[(frame.workload == workload) & (frame.status == "ok")]
    if shown.empty:
        return blocks, []
    runs = [records_by_id[i] for i in shown.run_id]
    frameworks = _join(f"{r.get('framework')} {r.get('framework_version')}" for r in runs)
    caption = (f"Machines: {_join((r.get('host') or {}).get('name') for r in runs)}. "
               f"Global batch: {_join(r.get('global_batch') for r in runs)}. Frameworks: {frameworks}.")
    plot = layout_plot(workload, frame, records_by_id, caption)
    return blocks + [Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png())], [plot]


def build_report(records: list[dict], results: str, filters: str = "", skipped: int = 0,
                 folder: list[dict] | None = None) -> tuple[list[Block], dict[str, list[Plot]]]:
    """The blocks of the whole report, and per workload the plots behind its figures (for the tests). `folder`:
    every record of the results folder, for the sweep index (default: `records`)."""
    frame = summary_frame(records)
    records_by_id = {r["run_id"]: r for r in records}
    # A layout sweep runs several layouts at one device count: its runs have their own figure, not a line.
    layouts = layout_frame(records)
    lines = [r for r in records if not in_layout_table(r)]
    series = build_series(lines, frame[frame.run_id.isin({r["run_id"] for r in lines})])
    blocks = header(records, results, filters, skipped, records if folder is None else folder)
    plots = {}
    for workload in sorted(frame.workload.unique()):
        section, plots[workload] = workload_section(workload, frame, records_by_id, series.get(workload, []))
        extra, layout_plots = layout_section(workload, layouts, records_by_id)
        blocks += section + extra
        plots[workload] += layout_plots
    repeated, plots["repeats"] = repeats_section(records)
    blocks += repeated + calibration_blocks(records) + breakdown_blocks(records) + validation_blocks(Path(results)) \
        + published_blocks(Path(results))
    blocks += attribution_blocks(records)
    blocks += plan_blocks(Path(results))
    return blocks, plots
