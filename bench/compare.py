"""python -m bench.compare --gpus 1,2,4 [--backends a,b] [--workloads cnn,mlm] [run options]

A sweep: every (workload, backend, device count) as its own `bench.run` subprocess, all with the
same threads per device. Every run leaves a record whatever its status; the sweep goes on, prints
a table and writes summary.csv. Exit 0 when the sweep itself completed.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.cli import OneLineParser, add_run_options, backend_names, int_list, name_list, workload_names
from common.devices import default_threads_per_device
from common.launch import TERM_GRACE_S, child_env, log_tail
from common.record import skeleton
from common.results import load_records, new_run_id, summary_frame, utc_now, write_record, write_summary

# The run options bench.compare forwards to every bench.run, as (attribute, flag, kind).
_FORWARD = [(a.dest, a.option_strings[0],
             "bool" if isinstance(a, argparse.BooleanOptionalAction) else "flag" if a.nargs == 0 else "value")
            for a in (lambda p: (add_run_options(p), p._actions)[1])(argparse.ArgumentParser())
            if a.option_strings and a.dest != "help"]
HARNESS_MARGIN_S = 120.0  # bench.run's own start-up and record writing, on top of --timeout


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", "--devices", dest="devices", type=int_list, default=[1, 2],
                   help="device counts to sweep, e.g. 1,2,4 (CUDA when present, else virtual CPU devices)")
    p.add_argument("--backends", type=name_list(backend_names()), default=list(backend_names()))
    p.add_argument("--workloads", type=name_list(workload_names()), default=list(workload_names()))
    add_run_options(p)
    return p


def run_command(args, backend: str, workload: str, devices: int, run_id: str, sweep_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "bench.run", "--backend", backend, "--workload", workload,
           "--devices", str(devices), "--run-id", run_id, "--sweep-id", sweep_id]
    for dest, flag, kind in _FORWARD:
        value = getattr(args, dest)
        if kind == "flag":
            cmd += [flag] if value else []
        elif kind == "bool":  # --x / --no-x: both values must reach bench.run
            cmd += [flag if value else f"--no-{flag[2:]}"]
        elif value is not None:
            cmd += [flag, str(value)]
    return cmd


def record_harness_failure(args, backend, workload, devices, run_id, sweep_id, status, error) -> None:
    """bench.run ended without a record (bad input for this N, or it died): the sweep writes one."""
    record = skeleton(run_id, backend, workload, devices, utc_now(), sweep_id=sweep_id,
                      scaling=args.scaling, seed=args.seed, data=args.data)
    record.update(status=status, error=error, duration_s=0.0)
    write_record(record, Path(args.out))


def run_one(args, backend, workload, devices, sweep_id, log_dir: Path) -> str:
    run_id = new_run_id(backend, workload, devices)
    log = log_dir / f"{run_id}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(run_command(args, backend, workload, devices, run_id, sweep_id),
                                env=child_env({}), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout + HARNESS_MARGIN_S)
        except subprocess.TimeoutExpired:
            proc.terminate()  # bench.run then stops its own workers
            try:
                proc.wait(timeout=TERM_GRACE_S + 10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
    if (Path(args.out) / "runs" / f"{run_id}.json").is_file():
        return run_id
    if rc == 2:
        record_harness_failure(args, backend, workload, devices, run_id, sweep_id, "unsupported",
                               f"invalid for {devices} device(s): {log_tail(log, 1)}")
    else:
        why = "harness timed out" if rc is None else f"bench.run exited {rc} without a record"
        record_harness_failure(args, backend, workload, devices, run_id, sweep_id, "failed",
                               f"{why}: {log_tail(log)}")
    return run_id


def _fmt(value, pattern: str) -> str:
    return "" if value is None or value != value else pattern.format(value)


def _devices_cell(row) -> str:
    """e.g. '2 cpu (virtual, 1 thread each)' or '4 cuda': a reader must know what N counted."""
    if not isinstance(row.device_kind, str):
        return str(row.devices)
    if row.device_kind == "cpu":
        flag = ", oversubscribed" if row.oversubscribed is True else ""
        return f"{row.devices} cpu (virtual, {row.threads_per_device:g} thr{flag})"
    return f"{row.devices} {row.device_kind}" + (" (virtual)" if row.virtual is True else "")


def print_table(console: Console, frame) -> None:
    table = Table(title="parbench sweep")
    for col in ("workload", "backend", "devices", "status", "samples/s", "efficiency", "step p50 (s)",
                "data wait", "eval", "note"):
        left = col in ("workload", "backend", "devices", "status", "note")
        table.add_column(col, justify="left" if left else "right")
    for row in frame.itertuples():
        table.add_row(row.workload, row.backend, _devices_cell(row), row.status, _fmt(row.samples_per_s, "{:.1f}"),
                      _fmt(row.scaling_efficiency, "{:.2f}"), _fmt(row.step_time_p50, "{:.4f}"),
                      _fmt(row.data_wait_fraction, "{:.1%}"), _fmt(row.eval_value, "{:.4f}"),
                      (row.error or "")[:80] if row.status != "ok" else "")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads_per_device is None:
        args.threads_per_device = default_threads_per_device(max(args.devices))
    sweep_id = datetime.now(timezone.utc).strftime("sweep-%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)
    out = Path(args.out)
    log_dir = out / "logs" / sweep_id
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = [(w, b, n) for w in args.workloads for b in args.backends for n in args.devices]
    console = Console(stderr=True)
    console.print(f"{sweep_id}: {len(plan)} runs, {args.threads_per_device} thread(s) per virtual CPU device")
    run_ids = []
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("sweep", total=len(plan))
        for workload, backend, devices in plan:
            progress.update(task, description=f"{backend} {workload} N={devices}")
            run_ids.append(run_one(args, backend, workload, devices, sweep_id, log_dir))
            progress.advance(task)
    write_summary(out)
    mine = [r for r in load_records(out) if r["run_id"] in set(run_ids)]
    # Off a terminal rich assumes 80 columns, which would cut backend names in logs.
    print_table(Console(width=None if sys.stdout.isatty() else 160), summary_frame(mine))
    console.print(f"{len(plan)} runs in {time.monotonic() - started:.0f} s; records in {out / 'runs'}, "
                  f"summary {out / 'summary.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
