"""The sweeps of a results folder: the index at the top of a report, and `bench.report --sweep ID`.

A sweep is every record with one `sweep_id` (bench.compare names it and passes it, with its own command line,
to each bench.run it starts). Runs of bench.run alone have no sweep id: together they are the folder's
runs outside a sweep, selected as `--sweep none`.
"""
from __future__ import annotations

from collections import Counter

from bench.reporting.document import Table
from bench.reporting.keys import describe_sweep
from common.config_key import NO_SWEEP, started, sweep_of
from common.results import STATUSES

OUTSIDE = "none"  # --sweep none: the runs started by bench.run alone


def sweep_ids(records: list[dict]) -> list[str]:
    """The folder's sweeps, oldest first."""
    first: dict[str, tuple] = {}
    for r in sorted(records, key=started):
        first.setdefault(sweep_of(r), started(r))
    return sorted(first, key=first.get)


def matching(records: list[dict], wanted: str) -> list[dict]:
    """The records of sweep `wanted`: its id as recorded, as the index shows it (without 'sweep-'), or 'none'."""
    if wanted == OUTSIDE:
        return [r for r in records if sweep_of(r) == NO_SWEEP]
    return [r for r in records if sweep_of(r) in (wanted, f"sweep-{wanted}")]


def _command(runs: list[dict]) -> str:
    commands = {r.get("sweep_command") for r in runs} - {None, ""}
    if commands:
        return "; ".join(sorted(commands))
    return "bench.run, a command per run" if not sweep_of(runs[0]) else "not recorded (a sweep before the field)"


def _counts(runs: list[dict]) -> str:
    counts = Counter(r["status"] for r in runs)
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])


def _when(runs: list[dict]) -> str:
    times = sorted(r["started_at"][:19].replace("T", " ") for r in runs if r.get("started_at"))
    if not times:
        return "?"
    return times[0] if times[0] == times[-1] else f"{times[0]} to {times[-1]}"


def sweep_index(records: list[dict]) -> Table:
    rows = []
    for sweep in sweep_ids(records):
        runs = [r for r in records if sweep_of(r) == sweep]
        rows.append([describe_sweep(sweep) if sweep else f"{describe_sweep(sweep)} (--sweep {OUTSIDE})",
                     _when(runs), _command(runs), ", ".join(sorted({r["backend"] for r in runs})),
                     ", ".join(sorted({r["workload"] for r in runs})), _counts(runs)])
    return Table(["sweep", "when (UTC)", "command", "backends", "workloads", "runs"], rows)
