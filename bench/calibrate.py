"""python -m bench.calibrate --gpus 1,2 [--backends a,b] [--workloads cnn,mlm] [--repeats 2] [run options]

Holds every backend against its framework's own bare loop: for each workload, backend and device count,
the suite's `bench.run` and the bare idiom (backends/<name>/bare.py) on the same config, alternately
(suite-bare, then bare-suite, ...) `--repeats` times each. Each ok suite record gets `calibration`
(ratio = median suite / median bare samples/s); with --breakdown-steps (default 3 here) the suite runs also
record where a step's time goes. Takes bench.compare's options.
"""
from __future__ import annotations

import json
import secrets
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench import compare
from common.calibration import BARE_RESULTS, HARNESS_BOUND_BELOW, calibration_entry
from common.devices import default_threads_per_device, threads_phrase
from common.results import RUN_RECORDS, new_run_id, write_record, write_summary
from common.sections import Breakdown, GradComm

DEFAULT_BREAKDOWN_STEPS = 3


def build_parser():
    p = compare.build_parser()
    p.prog, p.description = "bench.calibrate", __doc__.split("\n\n")[0]
    # bench.compare's --repeats: here each repeat is a suite run and a bare run, alternated.
    p.set_defaults(breakdown_steps=DEFAULT_BREAKDOWN_STEPS, repeats=2)
    return p


def run_bare(args, backend: str, workload: str, devices: int, sweep_id: str, log_dir: Path) -> dict | None:
    """One bare-loop run through bench.run --bare; its result, or None (the log says why)."""
    run_id = new_run_id(backend, workload, devices)
    cmd = compare.run_command(args, backend, workload, devices, run_id, sweep_id) + ["--bare"]
    path = Path(args.out) / BARE_RESULTS / f"{run_id}.json"
    compare.launch(args, cmd, log_dir / f"{run_id}.bare.log", run_id, path)
    return json.loads(path.read_text()) if path.is_file() else None


def calibrate_one(args, backend: str, workload: str, devices: int, sweep_id: str, log_dir: Path) -> list[dict]:
    """The suite's records of one configuration, each ok one with `calibration` written in."""
    run_ids, bares = [], []
    for repeat in range(args.repeats):
        # ABAB would give the bare loop the warmer machine every time; alternating the order evens it out.
        order = ("suite", "bare") if repeat % 2 == 0 else ("bare", "suite")
        for which in order:
            if which == "suite":
                run_ids.append(compare.run_one(args, backend, workload, devices, sweep_id, log_dir))
            else:
                bares.append(run_bare(args, backend, workload, devices, sweep_id, log_dir))
    runs = Path(args.out) / RUN_RECORDS
    records = [json.loads((runs / f"{rid}.json").read_text()) for rid in run_ids]
    ok = [r for r in records if r["status"] == "ok" and r.get("samples_per_s")]
    bare_ok = [b for b in bares if b and b.get("samples_per_s")]
    if ok and bare_ok and len(ok) == len(bare_ok):
        entry = calibration_entry([r["samples_per_s"] for r in ok], [b["samples_per_s"] for b in bare_ok],
                                  bare_ok[0]["idiom"])
        for record in ok:
            record["calibration"] = entry
            write_record(record, Path(args.out))
    return records


def _ms(value) -> str:
    return "" if value is None else f"{value * 1e3:.1f}"


def print_table(console: Console, records: list[dict]) -> None:
    table = Table(title="parbench calibration: suite vs the framework's bare loop (samples/s)")
    for col in ("workload", "backend", "N", "suite", "bare", "ratio", "spread", "fwd+bwd ms", "comm ms",
                "opt ms", "data ms", "other ms", "step ms", "busbw / link GB/s", "note"):
        table.add_column(col, justify="left" if col in ("workload", "backend", "note") else "right")
    seen = set()
    for r in records:
        key = (r["workload"], r["backend"], r["devices"])
        cal = r.get("calibration")
        if key in seen or (cal is None and r["status"] == "ok"):
            continue
        seen.add(key)
        if r["status"] != "ok":
            table.add_row(*key[:2], str(key[2]), *[""] * 11, escape(f"{r['status']}: {(r.get('error') or '')[:60]}"))
            continue
        bd = Breakdown.from_metrics(r.get("backend_metrics"))
        gc = GradComm.from_metrics(r.get("backend_metrics"))
        bw = "" if not gc or not gc.busbw_GBps else f"{gc.busbw_GBps:.2f} / {gc.link_GBps or 0:.2f}"
        flag = f"harness-bound ({cal['ratio']:.2f} < {HARNESS_BOUND_BELOW})" if cal["harness_bound"] else ""
        table.add_row(*key[:2], str(key[2]), f"{statistics.median(cal['suite_samples_per_s']):.1f}",
                      f"{cal['bare_samples_per_s']:.1f}", f"{cal['ratio']:.2f}", f"{cal['spread'] or 0:.2f}",
                      *(_ms(getattr(bd, k)) if bd else "" for k in ("forward_backward_s", "grad_comm_s", "optimizer_s",
                                                                      "data_s", "other_s", "step_s")), bw, flag)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    compare.cancel_on_signals()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.layouts:
        parser.error("--layouts: bench.calibrate sweeps device counts (--gpus); compare layouts with bench.compare")
    args.devices = args.devices or [1, 2]
    args.backends = args.backends or list(compare.backend_names())
    if args.threads_per_device is None:
        args.threads_per_device = default_threads_per_device(max(args.devices))
    sweep_id = datetime.now(timezone.utc).strftime("calibrate-%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)
    out = Path(args.out)
    log_dir = out / "logs" / sweep_id
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = [(w, b, n) for w in args.workloads for b in args.backends for n in args.devices]
    console = Console(stderr=True)
    console.print(f"{sweep_id}: {len(plan)} configurations x {args.repeats} repeats x (suite + bare)"
                  f"{threads_phrase(args.threads_per_device, args.device_kind)}")
    started, records = time.monotonic(), []
    try:
        for workload, backend, devices in plan:
            console.print(f"{backend} {workload} N={devices}")
            records += calibrate_one(args, backend, workload, devices, sweep_id, log_dir)
    except (compare.Cancelled, compare.SweepCancelled) as exc:
        return compare.cancelled(exc, out, [r["run_id"] for r in records], len(plan) * args.repeats, console)
    write_summary(out)
    print_table(Console(width=None if sys.stdout.isatty() else 200), records)
    console.print(f"{len(plan)} configurations in {time.monotonic() - started:.0f} s; records in {out / 'runs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
