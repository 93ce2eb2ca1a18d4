"""python -m bench.report [--results results/] [--sweep ID] [--workload W] [--backends a,b] [--since DATE]
                        [--baseline DIR [--fail-on-regression PCT]]

Reads the run records under RESULTS/runs and writes RESULTS/report.md, a self-contained
RESULTS/report.html and the figures under RESULTS/plots/. The report opens with an index of the folder's
sweeps; --sweep ID reports one of them. Bad input (no such folder or sweep, no records left after
filtering, a bad date) is one line on stderr and exit 2, with nothing written.

With --baseline, the rows both folders measured are compared (docs/comparison.md); with
--fail-on-regression PCT the exit status is 1 when a row is slower than the baseline by more than PCT
percent beyond the noise, so that the command can guard a CI pipeline.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from bench.cli import OneLineParser, backend_names, name_list, percentage, workload_names
from bench.reporting.comparison import baseline_section, regressions
from bench.reporting.compose import PLOTS_DIR, build_report
from bench.reporting.document import Image, to_markdown
from bench.reporting.html import to_html
from bench.reporting.keys import describe_sweep
from bench.reporting.sweeps import OUTSIDE, matching, sweep_ids
from common.results import load_records, validate_record, write_atomic


def iso_datetime(text: str) -> datetime:
    """An ISO date or datetime; without a zone it is UTC, like every started_at the harness writes."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO date or datetime, e.g. 2026-11-22, got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="results", help="results directory holding runs/ (default results/)")
    p.add_argument("--sweep", metavar="ID", help="only this sweep, its id as the report's sweep index shows it "
                   f"(e.g. 20261124T104755Z-8f7ccb); '{OUTSIDE}' for the runs bench.run made outside a sweep")
    p.add_argument("--workload", choices=workload_names(), help="only this workload")
    p.add_argument("--backends", type=name_list(backend_names()), help="only these backends, e.g. torch_ddp,torch_dp")
    p.add_argument("--since", type=iso_datetime, help="only runs started at or after this ISO date/datetime (UTC)")
    p.add_argument("--baseline", metavar="DIR", help="a results folder to compare with: the same rows side by side, "
                   "the ratio with its 95%% interval, regressions and improvements beyond the noise flagged")
    p.add_argument("--fail-on-regression", type=percentage, metavar="PCT",
                   help="with --baseline: exit 1 when a row is slower by more than PCT%% beyond the noise")
    return p


def _started(record: dict) -> datetime | None:
    try:
        return iso_datetime(record["started_at"])
    except (argparse.ArgumentTypeError, TypeError):
        return None


def select(records: list[dict], args, own_folder: bool = True) -> list[dict]:
    """The records that pass the filters; a baseline folder's (own_folder False) are not held to --sweep."""
    if args.sweep and own_folder:
        records = matching(records, args.sweep)
    kept = []
    for r in records:
        if args.workload and r["workload"] != args.workload:
            continue
        if args.backends and r["backend"] not in args.backends:
            continue
        if args.since:
            started = _started(r)
            if started is None or started < args.since:
                continue
        kept.append(r)
    return kept


def describe_filters(args) -> str:
    parts = [f"sweep {args.sweep}"] if args.sweep else []
    parts += [f"workload {args.workload}"] if args.workload else []
    parts += [f"backends {','.join(args.backends)}"] if args.backends else []
    parts += [f"started at or after {args.since.isoformat()}"] if args.since else []
    return "; ".join(parts)


def write_report(results: Path, blocks) -> list[Path]:
    """Figures first, so that report.md and report.html never point at a figure not yet there; figures of an
    earlier report that this one does not draw are removed, so plots/ holds exactly this report's."""
    images = [b for b in blocks if isinstance(b, Image)]
    written = []
    for image in images:
        write_atomic(results / image.path, image.png)
        written.append(results / image.path)
    for stale in set((results / PLOTS_DIR).glob("*.png")) - set(written):
        stale.unlink()
    write_atomic(results / "report.md", to_markdown(blocks).encode())
    write_atomic(results / "report.html", to_html(blocks, "parbench report").encode())
    return [results / "report.md", results / "report.html", *written]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    results = Path(args.results)
    if args.fail_on_regression is not None and not args.baseline:
        parser.error("--fail-on-regression needs --baseline")
    records, skipped, folder = _records(parser, results, args)
    blocks, _ = build_report(records, str(results), describe_filters(args), skipped=skipped, folder=folder)
    slower = None
    if args.baseline:
        baseline, _, _ = _records(parser, Path(args.baseline), args, what="--baseline")
        section, _, frame = baseline_section(records, baseline, args.baseline)
        blocks += section
        slower = regressions(frame, (args.fail_on_regression or 0) / 100)
    written = write_report(results, blocks)
    print(f"report: {written[0]}, {written[1]} and {len(written) - 2} figure(s) in {results / PLOTS_DIR}")
    if slower is not None:
        print(f"against {args.baseline}: {len(frame)} row(s) in common, {len(slower)} slower beyond the noise"
              + (f" and {args.fail_on_regression:g}%" if args.fail_on_regression else "")
              + "".join(f"\n  slower: {r.workload} {r.backend} N={r.devices} x{r.ratio:.3f} "
                        f"[{r.ratio_low:.3f}, {r.ratio_high:.3f}]" for r in slower.itertuples()))
        if args.fail_on_regression is not None and len(slower):
            return 1
    return 0


def _records(parser, results: Path, args, what: str = "--results") -> tuple[list[dict], int, list[dict]]:
    """The valid records of a results folder that pass the filters, how many were left out as invalid, and
    every valid record (the sweep index lists the folder's every sweep)."""
    if results.exists() and not results.is_dir():
        parser.error(f"{what} {results}: is a file, not a results directory (the folder holding runs/)")
    if not results.is_dir():
        parser.error(f"no results directory {results}")
    loaded = load_records(results)
    valid = [r for r in loaded if isinstance(r, dict) and not validate_record(r)]
    own_folder = what == "--results"
    if args.sweep and own_folder and not matching(valid, args.sweep):
        known = [describe_sweep(s) if s else OUTSIDE for s in sweep_ids(valid)]
        parser.error(f"no sweep {args.sweep} in {results / 'runs'}; its sweeps: "
                     + (", ".join(known[-5:]) + (f" and {len(known) - 5} older" if len(known) > 5 else "")
                        if known else "none"))
    records = select(valid, args, own_folder)
    if not records:
        filters = describe_filters(args)
        parser.error(f"no run records in {results / 'runs'}" + (f" match {filters}" if filters and valid else ""))
    return records, len(loaded) - len(valid), valid


if __name__ == "__main__":
    sys.exit(main())
