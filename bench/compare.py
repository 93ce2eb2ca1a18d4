"""python -m bench.compare --gpus 1,2,4 [--backends a,b] [--workloads cnn,mlm] [run options]
python -m bench.compare --layouts dp2,tp2,pp2-nmb4-1f1b [--backends torch_3d] [--workloads mlm] [run options]

A sweep: every (workload, backend, device count) as its own `bench.run` subprocess, all with the
same threads per device. Every run leaves a record whatever its status; the sweep goes on, prints
a table and writes summary.csv. Exit 0 when the sweep itself completed.

With --layouts (names: bench/layouts.py) the sweep runs each layout at the devices it implies, all at
one global batch (--scaling strong: --batch-size is the global batch), plus the 1-device run of that
global batch for each micro-batch count among them (pp<N>-nmb<K> <-> 1 device --grad-accum K).

With --srun (inside a SLURM job; bench.slurm writes such scripts) each run is a job step over every node of
the job, one bench.run per node, and --gpus counts devices per node.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from backends import BACKENDS, layout_backend
from bench import co_run
from bench import run as bench_run
from bench.cli import (
    RUN_OPTIONS,
    OneLineParser,
    add_run_options,
    backend_names,
    default_layout_backend,
    forwarded,
    int_list,
    name_list,
    positive_int,
    workload_names,
)
from bench.layouts import layout_list, one_device_references
from bench.reporting.intervals import interval_frame, ranked
from bench.reporting.layouts import LAYOUT_SWEEP_PREFIX, layout_frame
from common.devices import default_threads_per_device, threads_phrase
from common.errors import BadInput, Cancelled
from common.launch import TERM_GRACE_S, cancel_on_signals, child_env, log_tail
from common.layout import Layout
from common.plan.fit import DoesNotFit
from common.record import skeleton
from common.results import (
    load_records,
    new_run_id,
    summary_frame,
    utc_now,
    write_atomic,
    write_record,
    write_summary,
)
from common.scheduler import job_node_count, srun_command
from common.sections import FitCheck
from common.spec import DEFAULT_WORKLOADS

HARNESS_MARGIN_S = 120.0  # bench.run's own start-up and record writing, on top of --timeout
# The run options a --layouts entry sets (and bench.compare then refuses on its own command line).
SET_BY_LAYOUTS = tuple(o.dest for o in RUN_OPTIONS if o.layout)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", "--devices", dest="devices", type=int_list,
                   help="device counts to sweep, e.g. 1,2,4 (default 1,2; CUDA when present, else virtual CPU "
                        "devices)")
    p.add_argument("--layouts", type=layout_list,
                   help="parallel layouts to sweep instead of device counts, e.g. dp2,tp2,pp2-nmb4-1f1b,fsdp2,dp2xtp2 "
                        "(docs/layouts.md); each at the devices it implies, one global batch for all")
    p.add_argument("--backends", type=name_list(backend_names()),
                   help=f"default: every backend; with --layouts, the one that runs every layout ({layout_backend()})")
    p.add_argument("--workloads", type=name_list(workload_names()), default=list(DEFAULT_WORKLOADS),
                   help=f"default: {','.join(DEFAULT_WORKLOADS)} (lm, the decoder LM, when asked for)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="run every row R times, the rows interleaved in each repeat (order reversed every other "
                        "repeat), and report each row's median and 95%% interval (docs/comparison.md)")
    p.add_argument("--co-run-probe", action="store_true",
                   help="on a CPU host, after the plan's first 1-device run of each backend and workload (every "
                        "repeat of it), run it again as the sweep's largest device count of processes side by side, "
                        "and write how much they slow each other into its record (bench.co_run; bench.predict uses "
                        "their median)")
    p.add_argument("--srun", action="store_true",
                   help="inside a SLURM job (sbatch): run each bench.run as a job step over every node of the job, "
                        "one task per node (bench.slurm's scripts do this); --gpus is then per node")
    add_run_options(p)
    return p


def run_command(args, backend: str, workload: str, devices: int, run_id: str, sweep_id: str,
                layout: Layout | None = None, grad_accum: int = 1) -> list[str]:
    """bench.run with the sweep's options; for a layout, its own layout flags and --grad-accum instead."""
    cmd = [sys.executable, "-m", "bench.run", "--backend", backend, "--workload", workload,
           "--devices", str(devices), "--run-id", run_id, "--sweep-id", sweep_id]
    if getattr(args, "sweep_command", ""):  # main() sets it: the sweep's own command line, for every record
        cmd += ["--sweep-command", args.sweep_command]
    # A backend's own options reach that backend only (the registry says whose they are).
    cmd += forwarded(args, BACKENDS[backend].options, skip=(*SET_BY_LAYOUTS, "grad_accum") if layout else ())
    if layout:
        cmd += ["--grad-accum", str(grad_accum), *layout.run_flags()]
    return cmd


def bad_input(args, plan, sweep_id: str) -> dict[int, BadInput]:
    """bench.run's own checks (those that need no framework, the fit check among them) for every planned run, in
    this process: why each run that bench.run would refuse is bad input, by its index in the plan."""
    parser = bench_run.build_parser()
    # Under --srun every run spans the job's nodes: its world (and so its batch split) is nodes x devices.
    nodes = ["--nnodes", str(args.job_nodes)] if args.srun else []
    bad = {}
    for i, (workload, backend, devices, layout, grad_accum) in enumerate(plan):
        cmd = run_command(args, backend, workload, devices, "check", sweep_id, layout, grad_accum)
        try:
            bench_run.check_run(parser.parse_args(cmd[3:] + nodes))
        except BadInput as exc:
            bad[i] = exc
    return bad


def record_harness_failure(args, backend, workload, devices, run_id, sweep_id, status, error, layout=None,
                           grad_accum: int = 1, fit: FitCheck | None = None) -> None:
    """bench.run ended without a record (bad input for this N, or it died): the sweep writes one; a run refused
    as predicted not to fit keeps the figures (`fit`)."""
    record = skeleton(run_id, backend, workload, devices, utc_now(), sweep_id=sweep_id,
                      sweep_command=getattr(args, "sweep_command", ""), scaling=args.scaling, seed=args.seed,
                      data=args.data)
    if layout:  # so that the report still names the layout that did not run
        record.update(layout=asdict(layout), config={"grad_accum": grad_accum})
    if fit is not None:
        record.update(fit.to_record())
    record.update(status=status, error=error, duration_s=0.0)
    write_record(record, Path(args.out))


def stop_run(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Signal bench.run, which stops its own workers and launcher (they sit in process groups of their
    own); SIGKILL its group only if it has not done so in time."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=TERM_GRACE_S + 10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class SweepCancelled(Exception):
    def __init__(self, cancelled: Cancelled, run_id: str, record_written: bool):
        super().__init__(run_id)
        self.cancelled, self.run_id, self.record_written = cancelled, run_id, record_written


def run_one(args, backend, workload, devices, sweep_id, log_dir: Path, layout: Layout | None = None,
            grad_accum: int = 1, invalid: BadInput | None = None, srun_nodes: int = 0) -> str:
    """One bench.run; with `srun_nodes`, as a SLURM job step over that many nodes (--srun), `devices` on each."""
    world = devices * max(srun_nodes, 1)  # the run's name and a harness record count the world, as bench.run does
    run_id = new_run_id(backend, workload, world)
    if invalid:  # bad input for this run only (the sweep refused input bad for every run)
        what = f"layout {layout.name}" if layout else f"{devices} device(s)"
        record_harness_failure(args, backend, workload, world, run_id, sweep_id, "invalid",
                               f"invalid for {what}: {invalid}", layout, grad_accum,
                               invalid.check if isinstance(invalid, DoesNotFit) else None)
        return run_id
    log = log_dir / f"{run_id}.log"
    record = Path(args.out) / "runs" / f"{run_id}.json"
    step = srun_command(srun_nodes) if srun_nodes else []
    rc = launch(args, step + run_command(args, backend, workload, devices, run_id, sweep_id, layout, grad_accum),
                log, run_id, record)
    if record.is_file():
        return run_id
    if rc == 2:  # refused by a backend's own check, e.g. a layout that does not divide the model
        why = refusal(log)
        what = f"layout {layout.name}" if layout else f"{devices} device(s)"
        record_harness_failure(args, backend, workload, world, run_id, sweep_id, "invalid",
                               f"invalid for {what}: {why}", layout, grad_accum)
    else:
        why = "harness timed out" if rc is None else f"bench.run exited {rc} without a record"
        record_harness_failure(args, backend, workload, world, run_id, sweep_id, "failed",
                               f"{why}: {log_tail(log)}", layout, grad_accum)
    return run_id


def co_run_probe(args, plan, backend: str, workload: str, sweep_id: str, layout: Layout | None, grad_accum: int,
                 run_id: str, console: Console) -> None:
    """--co-run-probe after a 1-device run (bench.co_run): its command again as K processes side by side, where
    it ran ok on a CPU and the sweep holds a run of more devices of its backend and workload."""
    largest = max(n for w, b, n, _, _ in plan if (w, b) == (workload, backend))
    path = Path(args.out) / "runs" / f"{run_id}.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    if record.get("status") != "ok" or record.get("device_kind") != "cpu":
        return
    k = co_run.processes((record.get("host") or {}).get("cores"), record.get("threads_per_device"), largest)
    if not k:
        console.print(f"co-run probe of {run_id}: fewer than two processes fit the cores; not measured")
        return

    def command(folder: Path) -> list[str]:
        copy = new_run_id(backend, workload, 1)
        return [*run_command(args, backend, workload, 1, copy, sweep_id, layout, grad_accum),
                "--out", str(folder), "--skip-eval", "--profile", "0", "--breakdown-steps", "0"]  # the window only
    section = co_run.probe(record, k, command, Path(args.out), args.timeout + HARNESS_MARGIN_S, stop_run)
    if section:
        co_run.attach(path, section)
        console.print(f"co-run probe of {run_id}: {k} copies side by side took a median "
                      f"{statistics.median(section.step_s_p50) * 1e3:.0f} ms a step against "
                      f"{record['step_time_s']['p50'] * 1e3:.0f} ms alone: x{section.slowdown:.3f}")


def refusal(log: Path) -> str:
    """bench.run's one line of bad input (under srun, srun's own lines follow it)."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("bench.run: error: ")]
        if lines:
            return lines[-1].removeprefix("bench.run: error: ")
    return log_tail(log, 1)


def launch(args, cmd: list[str], log: Path, run_id: str, result: Path) -> int | None:
    """Run one bench.run to its end, output to `log`; its exit code, None when it timed out. A signal to
    the sweep stops it and raises SweepCancelled, saying whether it wrote `result` as the signal came."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=child_env({}), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout + HARNESS_MARGIN_S)
        except subprocess.TimeoutExpired:
            stop_run(proc)
            rc = None
        except Cancelled as exc:
            # bench.run is in a session of its own (a terminal's Ctrl-C reaches only the sweep), so the
            # sweep passes the signal on; bench.run writes no record for a run it did not finish.
            stop_run(proc, exc.signum)
            written = result.is_file()
            if not written:
                log.unlink(missing_ok=True)
            raise SweepCancelled(exc, run_id, written) from None
    return rc


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
    for col in ("workload", "backend", "devices", "data", "status", "samples/s", "efficiency", "MFU",
                "MFU (measured peak)", "step p50 (s)", "data wait", "eval", "note"):
        left = col in ("workload", "backend", "devices", "data", "status", "note")
        table.add_column(col, justify="left" if left else "right")
    for row in frame.itertuples():
        # "synthetic" beside an eval of 1.0000, which would otherwise read as the dataset's accuracy
        # An error quotes worker logs, whose "[file.cc:537]" rich would otherwise read as markup.
        table.add_row(row.workload, row.backend, _devices_cell(row), str(row.data or "?"), row.status,
                      _fmt(row.samples_per_s, "{:.1f}"), _fmt(row.scaling_efficiency, "{:.2f}"),
                      _fmt(row.mfu, "{:.1%}"), _fmt(row.mfu_achievable, "{:.1%}"), _fmt(row.step_time_p50, "{:.4f}"),
                      _fmt(row.data_wait_fraction, "{:.1%}"), _fmt(row.eval_value, "{:.4f}"),
                      escape(row.error or "") if row.status != "ok" else "")
    console.print(table)


def print_layout_table(console: Console, records: list[dict]) -> None:
    table = Table(title="parbench layouts (one global batch)")
    for col in ("workload", "backend", "layout", "N", "status", "samples/s", "efficiency vs 1 device", "note"):
        table.add_column(col, justify="right" if col in ("N", "samples/s", "efficiency vs 1 device") else "left")
    by_id = {r["run_id"]: r for r in records}
    for row in layout_frame(records).itertuples():
        table.add_row(row.workload, row.backend, row.layout, str(row.devices), row.status,
                      _fmt(row.samples_per_s, "{:.1f}"), _fmt(row.efficiency, "{:.2f}"),
                      escape(by_id[row.run_id].get("error") or "") if row.status != "ok" else "")
    console.print(table)


def check_layout_options(parser: OneLineParser, args) -> None:
    """--layouts fixes the devices, the layout flags and the scaling mode: refuse what would contradict it, then set
    them, and the backends when none are given."""
    defaults = build_parser().parse_args([])
    given = [o for o in RUN_OPTIONS if o.layout and getattr(args, o.dest) != getattr(defaults, o.dest)]
    if given:
        parser.error(f"--layouts sets the layout of every run; drop {given[0].flags[0]}")
    if args.devices:
        parser.error("--layouts sets the device count of every run (dp x tp x pp); drop --gpus/--devices")
    if args.scaling == "weak":
        parser.error("--layouts compares layouts at one global batch (strong scaling); drop --scaling weak")
    args.scaling = "strong"
    args.backends = args.backends or [default_layout_backend(parser, "runs")]


def sweep_plan(args) -> list[tuple[str, str, int, Layout | None, int]]:
    """(workload, backend, devices, layout, grad_accum) per run: device counts, or the layouts, each after
    the 1-device runs it is measured against (one per micro-batch count: pp<N>-nmb<K> <-> --grad-accum K)."""
    if not args.layouts:
        return [(w, b, n, None, args.grad_accum) for w in args.workloads for b in args.backends for n in args.devices]
    runs = [(one, args.grad_accum * k) for one, k in one_device_references(args.layouts)]
    runs += [(lay, args.grad_accum) for lay in args.layouts]
    return [(w, b, lay.devices, lay, accum) for w in args.workloads for b in args.backends for lay, accum in runs]


def probed_runs(plan: list[tuple[str, str, int, Layout | None, int]], order: list[tuple[int, int]]) \
        -> set[tuple[int, int]]:
    """The (repeat, row) runs --co-run-probe probes: each backend and workload's first 1-device row of the plan,
    after every repeat of it. Every repeat, since one probe per sweep moved a prediction by 10-20 points between
    sweeps; the same row each time, since bench.predict pools a run's probes over its own repeats (probing each
    repeat's first 1-device run in the order it ran mixed micro-batch counts: a repeat runs the rows in reverse)."""
    first: dict[tuple[str, str], int] = {}
    for i, (workload, backend, devices, _, _) in enumerate(plan):
        if devices == 1:
            first.setdefault((workload, backend), i)
    return {(repeat, i) for repeat, i in order if i in first.values()}


def repeat_order(rows: int, repeats: int) -> list[tuple[int, int]]:
    """(repeat, row) in the order they run: every row once per repeat, so that a drift of the machine
    spreads over all rows instead of landing on the last ones; every other repeat in reverse, so that
    a steady drift favours no row."""
    return [(r, i) for r in range(repeats) for i in (range(rows) if r % 2 == 0 else reversed(range(rows)))]


def print_interval_table(console: Console, frame) -> None:
    """Each row's median samples/s and efficiency with their 95% intervals over the repeats. Within one
    workload and device count, a row whose interval overlaps the fastest row's is 'no difference' from it,
    not ranked below it."""
    table = Table(title="parbench repeats: median and 95% interval (two-level bootstrap over runs and steps)")
    for col in ("workload", "backend", "layout", "N", "runs", "samples/s [95% interval]", "efficiency [95% interval]",
                "vs fastest of its N", "busy runs"):
        table.add_column(col, justify="left" if col in ("workload", "backend", "layout", "vs fastest of its N")
                         else "right")
    for row in ranked(frame).itertuples():
        eff = ("" if pd.isna(row.efficiency) else
               f"{row.efficiency:.2f} [{row.efficiency_low:.2f}, {row.efficiency_high:.2f}]")
        table.add_row(row.workload, row.backend, row.layout or "", str(row.devices), str(row.runs),
                      f"{row.samples_per_s:.1f} [{row.samples_per_s_low:.1f}, {row.samples_per_s_high:.1f}]",
                      eff, row.vs_fastest, str(row.busy_runs) if row.busy_runs else "")
    console.print(table)


def cancelled(exc: Cancelled | SweepCancelled, out: Path, run_ids: list[str], planned: int, console) -> int:
    """One line: what was cancelled, what was kept. A run the signal cut short has no record (bench.run
    writes none, and its logs go); the records of runs that finished stay, with a summary of them."""
    cut, kept = "no run was in progress", list(run_ids)
    if isinstance(exc, SweepCancelled):
        if exc.record_written:  # it finished as the signal came
            kept.append(exc.run_id)
        else:
            cut = f"run {exc.run_id} stopped with its workers, no record written"
        exc = exc.cancelled
    if kept:
        write_summary(out)
    console.print(f"bench.compare: cancelled by {exc.name}: {cut}; {planned - len(kept)} of {planned} runs not "
                  f"done; kept {len(kept)} record(s) of finished runs in {out / 'runs'}", soft_wrap=True)
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    cancel_on_signals()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.sweep_command = shlex.join(["python", "-m", "bench.compare", *(sys.argv[1:] if argv is None else argv)])
    if args.layouts:
        check_layout_options(parser, args)
    args.job_nodes = 0
    if args.srun:
        try:
            args.job_nodes = job_node_count()
        except BadInput as exc:
            parser.error(f"--srun: {exc}")
    args.devices = args.devices or [1, 2]
    args.backends = args.backends or list(backend_names())
    plan = sweep_plan(args)
    if args.threads_per_device is None:
        args.threads_per_device = default_threads_per_device(max(run[2] for run in plan))
    prefix = LAYOUT_SWEEP_PREFIX if args.layouts else "sweep-"
    sweep_id = datetime.now(timezone.utc).strftime(f"{prefix}%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)
    invalid = bad_input(args, plan, sweep_id)
    if len(invalid) == len(plan):  # bad for every run: refused before anything is written
        parser.error("; ".join(dict.fromkeys(map(str, invalid.values()))))
    out = Path(args.out)
    log_dir = out / "logs" / sweep_id
    log_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    order = repeat_order(len(plan), args.repeats)
    repeats = f" ({len(plan)} rows x {args.repeats} repeats)" if args.repeats > 1 else ""
    console.print(f"{sweep_id}: {len(order)} runs{repeats}{threads_phrase(args.threads_per_device, args.device_kind)}")
    run_ids, probed = [], probed_runs(plan, order) if args.co_run_probe else set()
    started = time.monotonic()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("sweep", total=len(order))
            for repeat, i in order:
                workload, backend, devices, layout, grad_accum = plan[i]
                if repeat and i in invalid:  # a configuration error is recorded once, not once per repeat
                    progress.advance(task)
                    continue
                what = f"{layout.name} (N={devices}, accumulating {grad_accum})" if layout else f"N={devices}"
                progress.update(task, description=f"{backend} {workload} {what}"
                                + (f", repeat {repeat + 1}/{args.repeats}" if args.repeats > 1 else ""))
                run_ids.append(run_one(args, backend, workload, devices, sweep_id, log_dir, layout, grad_accum,
                                       invalid.get(i), args.job_nodes))
                if (repeat, i) in probed:
                    co_run_probe(args, plan, backend, workload, sweep_id, layout, grad_accum, run_ids[-1], console)
                progress.advance(task)
        write_summary(out)
    except (Cancelled, SweepCancelled) as exc:
        return cancelled(exc, out, run_ids, len(order), console)
    mine = [r for r in load_records(out) if r["run_id"] in set(run_ids)]
    # Off a terminal rich assumes 80 columns, which would cut backend names in logs.
    table_console = Console(width=None if sys.stdout.isatty() else 160)
    if args.layouts:
        print_layout_table(table_console, mine)
    else:
        print_table(table_console, summary_frame(mine))
    written = ""
    if args.repeats > 1:
        intervals = interval_frame(mine)
        print_interval_table(table_console, intervals)
        path = write_atomic(out / f"intervals-{sweep_id}.csv", intervals.to_csv(index=False).encode())
        written = f", intervals {path}"
    console.print(f"{len(run_ids)} runs in {time.monotonic() - started:.0f} s; records in {out / 'runs'}, "
                  f"summary {out / 'summary.csv'}{written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
