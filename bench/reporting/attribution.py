"""The report's "where the step goes" section, from records with `backend_metrics.attribution` (--profile):
per row (workload, model size, layout, devices, precision, batch) a stacked bar per backend of the step's
shares by category group (common.attribution.GROUPS), frameworks side by side, a table of the same figures,
and, per row, the largest difference between two frameworks in one group named in words."""
from __future__ import annotations

import itertools

from matplotlib.figure import Figure

from bench.reporting.document import PLOTS_DIR, Block, Heading, Image, Table, Text
from bench.reporting.plots import Plot
from common.attribution import GROUPS, group_seconds
from common.sections import Attribution

COLORS = {"matmul": "#1f77b4", "attention": "#9467bd", "other compute": "#2ca02c", "communication": "#d62728",
          "data movement": "#ff7f0e", "host/idle": "#7f7f7f", "other": "#bcbd22"}


def _section(r: dict) -> Attribution | None:
    return Attribution.from_metrics(r.get("backend_metrics"))


def row_key(r: dict) -> tuple:
    """What two runs must share to sit on one row: the same work on the same devices."""
    lay = r.get("layout") or {}
    data = lay.get("dp", r["devices"]) * lay.get("fsdp", 1)   # the ranks that split the batch, replicas or shards
    layout = f"dp{data} tp{lay.get('tp', 1)} pp{lay.get('pp', 1)}"
    return (r["workload"], (r.get("config") or {}).get("model_size", ""), layout, r["devices"],
            r.get("precision") or (r.get("config") or {}).get("precision", ""), r.get("global_batch"))


def row_label(key: tuple) -> str:
    workload, size, layout, devices, precision, batch = key
    return f"{workload}{f' {size}' if workload == 'mlm' and size else ''}, {layout}, N={devices}, {precision}, " \
           f"batch {batch}"


def latest_profiled(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """Row -> backend -> the newest ok record of that backend with an attribution."""
    rows: dict[tuple, dict[str, dict]] = {}
    for r in sorted((r for r in records if r["status"] == "ok" and _section(r)), key=lambda r: r.get("started_at")
                    or ""):
        rows.setdefault(row_key(r), {})[r["backend"]] = r
    return dict(sorted(rows.items(), key=lambda kv: row_label(kv[0])))


def largest_difference(runs: dict[str, dict]) -> str | None:
    """The group whose seconds per step differ most between two backends of different frameworks, in words."""
    best = None
    for (a, ra), (b, rb) in itertools.combinations(sorted(runs.items()), 2):
        if ra.get("framework") == rb.get("framework"):
            continue
        sa, sb = group_seconds(_section(ra)), group_seconds(_section(rb))
        for group in GROUPS:
            diff = abs(sa[group] - sb[group])
            if best is None or diff > best[0]:
                best = (diff, group, (a, ra, sa), (b, rb, sb))
    if best is None:
        return None
    diff, group, *sides = best
    (fast, rf, sf), (slow, rs, ss) = sorted(sides, key=lambda side: side[2][group])
    af, as_ = _section(rf), _section(rs)
    return (f"{group}: {ss[group] * 1e3:.0f} ms per step in {slow} ({rs.get('framework')}, "
            f"{ss[group] / as_.step_s:.0%} of its {as_.step_s * 1e3:.0f} ms step) against {sf[group] * 1e3:.0f} ms "
            f"in {fast} ({rf.get('framework')}, {sf[group] / af.step_s:.0%} of {af.step_s * 1e3:.0f} ms), a difference "
            f"of {diff * 1e3:.0f} ms where the two steps differ by {(as_.step_s - af.step_s) * 1e3:+.0f} ms")


def attribution_plot(rows: dict[tuple, dict[str, dict]]) -> Plot:
    """One horizontal stacked bar per (row, backend): the step's shares by group, the step's ms at its end."""
    bars = [(row_label(key), backend, _section(r)) for key, runs in rows.items() for backend, r in runs.items()]
    fig = Figure(figsize=(11, 1.6 + 0.45 * len(bars)), layout="constrained")
    ax = fig.subplots()
    labels = [f"{label} · {backend}" for label, backend, _ in bars]
    data: dict[str, list] = {}
    left = [0.0] * len(bars)
    for group in GROUPS:
        shares = [group_seconds(a)[group] / a.step_s for _, _, a in bars]
        ax.barh(range(len(bars)), shares, left=left, color=COLORS[group], label=group)
        data[group] = list(zip(labels, shares))
        left = [x + s for x, s in zip(left, shares)]
    for i, (_, _, a) in enumerate(bars):
        ax.text(left[i] + 0.01, i, f"{a.step_s * 1e3:.0f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("share of the profiled step")
    ax.legend(ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    fig.suptitle("Where the step goes (--profile): share of the step by op category")
    caption = ("Each bar: one backend's profiled steps (after its measured window), op time from the framework's "
               "own profiler split into categories (docs/profiling.md); host/idle is time no op ran. The figure at "
               "the end is the profiled step in ms.")
    return Plot("attribution", "Where the step goes", caption, fig, data)


def attribution_blocks(records: list[dict]) -> list[Block]:
    rows = latest_profiled(records)
    if not rows:
        return []
    table = []
    for key, runs in rows.items():
        for backend, r in runs.items():
            a = _section(r)
            seconds = group_seconds(a)
            measured = "" if a.measured_step_s is None else f"{a.measured_step_s * 1e3:.0f}"
            concurrency = "" if a.op_concurrency is None else f"{a.op_concurrency:.2f}"
            table.append([row_label(key), backend, *(f"{seconds[g] * 1e3:.0f} ({seconds[g] / a.step_s:.0%})"
                                                     for g in GROUPS), f"{a.step_s * 1e3:.0f}", measured, concurrency])
    words = [f"{row_label(key)}: {text}." for key, runs in rows.items() if (text := largest_difference(runs))]
    plot = attribution_plot(rows)
    blocks: list[Block] = [
        Heading("Where the step goes, by op category", 2),
        Text("From --profile: ms per step (share of the profiled step) by category group, from each framework's own "
             "profiler over a few steps after the measured window; 'measured step' is the timed window's median, "
             "without the profiler; 'ops at once': how many threads ran an op at a time, on average while any did "
             "(a framework that runs independent ops side by side uses more cores than its threads per device). The "
             "categories and how each framework's op names map to them: docs/profiling.md."),
        Table(["row", "backend", *(f"{g} ms" for g in GROUPS), "profiled step ms", "measured step ms",
               "ops at once"], table),
        Image(f"{PLOTS_DIR}/{plot.slug}.png", plot.title, plot.caption, plot.png())]
    if words:
        blocks.append(Text("Largest difference between two frameworks on a row: " + " ".join(words)))
    return blocks
