"""python -m bench.parity [--data real|synthetic] [--workloads cnn,mlm] [--backends ...] [--out DIR]

Proves that the backends run the same experiment. Every backend trains the same first batches
through `bench.run` (the path every benchmark takes, records and all): on 1 device with 2
accumulated micro-batches and on 2 devices, the same global batch. The checks (parity_checks.py)
compare parameter counts, analytical FLOPs, the digests of the sample ids each device trained on,
the loss at step 0, the loss curve against the reference's (the first backend that ran), and each
backend's 2-device run against its 1-device run. How far curves may drift apart is measured, not
assumed: the reference runs six more times from slightly perturbed initial weights
(parity_checks.py says why and how much), where a curve needs it: a tolerance is never below float32
rounding, so curves within rounding pass whatever the perturbed runs would measure, and with --probes
auto (the default) those runs are made only when a curve is further off. Prints a table, writes
DIR/parity.json, exits 0 only if every check holds; the last line is the summary.

With --layouts (names: bench/layouts.py; backends default torch_3d) it checks layouts instead: each
layout trains the global batch 2b, against the same backend on 1 device with that global batch as
the same number of accumulated micro-batches (pp<N>-nmb<K> <-> --grad-accum K); the perturbed runs
are that 1-device run's. A layout must leave step 0's loss, the curve and the final parameters as
they were. With several backends (--backends torch_3d,keras_jax) each framework's run of a layout is
also held against the first backend's run of the same layout.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from backends import layout_backend
from bench import parity_checks as pc
from bench.cli import (
    OneLineParser,
    backend_names,
    default_layout_backend,
    name_list,
    positive_float,
    positive_int,
    workload_names,
)
from bench.layouts import layout_list, reference_accumulations
from common.launch import RunFailed, child_env, run_supervised
from common.layout import Layout
from common.results import write_json_atomic
from common.spec import DEFAULT_WORKLOADS, model_spec, training_flops_per_sample

HARNESS_MARGIN_S = 120.0  # bench.run's own start-up and record writing, on top of its --timeout
STOP = threading.Event()  # set when parity is stopped: every run in flight ends (run_one's health check)


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=("real", "synthetic"), default="synthetic")
    p.add_argument("--data-dir", help="data directory (default $PARBENCH_DATA_DIR or ~/.cache/parbench)")
    p.add_argument("--workloads", type=name_list(workload_names()), default=list(DEFAULT_WORKLOADS))
    p.add_argument("--backends", type=name_list(backend_names()),
                   help=f"default: every data-parallel backend (the data parallel of {layout_backend()}, which runs "
                        "every layout, is the dp2 of --layouts); with --layouts, that one")
    p.add_argument("--layouts", type=layout_list,
                   help="check these layouts against 1 device instead, e.g. dp2,tp2,pp2-nmb4-1f1b,fsdp2,dp2xtp2")
    p.add_argument("--probes", choices=("auto", "always"), default="auto",
                   help="the reference's runs from perturbed initial weights that measure its sensitivity: auto "
                        "(default) only where a curve or final weight is off by more than float32 rounding, which "
                        "no measured sensitivity would tighten; always: measured in every case")
    p.add_argument("--steps", type=positive_int, default=20, help="optimizer steps compared (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=4,
                   help="per-device batch b; the global batch is 2b (default 4), with --layouts too")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device-kind", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="cpu (default: the same on every machine), or cuda: on the GPUs, with virtual devices "
                        "(processes or replicas sharing a GPU) where a backend offers them")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="bench.run processes at once (default 1): parity compares numbers, not speed, so runs of "
                        "one device each may share a machine's cores")
    p.add_argument("--compile", action="store_true",
                   help="every run compiled (bench.run --compile: torch.compile, XLA, MindSpore jit level O1)")
    p.add_argument("--timeout", type=positive_float, default=900.0, help="wall-clock limit per run (s)")
    p.add_argument("--out", default="results/parity", help="records, logs and parity.json (default results/parity)")
    return p


def run_command(args, backend: str, workload: str, devices: int, run_id: str, probe: int = 0,
                layout: Layout | None = None, grad_accum: int = 1) -> list[str]:
    """bench.run at `devices` devices; the global batch is 2b either way (1 device: 2 micro-batches; a
    layout: its own flags, the 1-device reference `grad_accum` micro-batches).
    `probe` k > 0: initial weights perturbed by PROBE_PERTURBATION, draw k."""
    batch = (["--scaling", "weak", "--batch-size", str(args.batch_size), "--grad-accum", str(3 - devices)]
             if layout is None else ["--scaling", "strong", "--batch-size", str(2 * args.batch_size),
                                     "--grad-accum", str(grad_accum), *layout.run_flags()])
    cmd = [sys.executable, "-m", "bench.run", "--backend", backend, "--workload", workload,
           "--devices", str(devices), "--run-id", run_id, "--out", args.out, "--data", args.data,
           "--steps", str(args.steps), "--warmup-steps", "0", "--skip-eval", *batch, "--seed", str(args.seed),
           "--threads-per-device", "1", "--device-kind", args.device_kind, "--model-size", "tiny",
           "--timeout", str(args.timeout)]
    if args.compile:
        cmd.append("--compile")
    if probe:
        cmd += ["--init-perturbation", str(pc.PROBE_PERTURBATION), "--init-perturbation-seed", str(probe)]
    return cmd + (["--data-dir", args.data_dir] if args.data_dir else [])


def run_one(args, backend: str, workload: str, devices: int, stamp: str, probe: int = 0,
            layout: Layout | None = None, grad_accum: int = 1) -> dict:
    """The run's record; a stand-in `failed` record when bench.run left none (it died, or timed out)."""
    what = f"n{devices}" if layout is None else layout.name if devices > 1 else f"n1-accum{grad_accum}"
    run_id = f"parity-{stamp}-{backend}-{workload}-{what}" + (f"-probe{probe}" if probe else "")
    log = Path(args.out) / "logs" / f"{run_id}.log"
    try:
        rc = run_supervised(run_command(args, backend, workload, devices, run_id, probe, layout, grad_accum),
                            child_env({}), log, args.timeout + HARNESS_MARGIN_S,
                            health=lambda: "parity stopped" if STOP.is_set() else None)
    except RunFailed as exc:
        rc, why = None, str(exc)
    path = Path(args.out) / "runs" / f"{run_id}.json"
    if path.is_file():
        return json.loads(path.read_text())
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
    why = why if rc is None else f"bench.run exited {rc} without a record: {' '.join(tail)}"
    return {"run_id": run_id, "backend": backend, "workload": workload, "devices": devices,
            "status": "failed", "error": why}


def print_table(checks: list[pc.Check]) -> None:
    table = Table(title="bench.parity")
    for col in ("workload", "check", "result", "detail"):
        table.add_column(col)
    for c in checks:
        table.add_row(c.workload, c.name, c.status, escape(c.detail))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def _exit_on_sigterm(signum, frame):
    # SystemExit unwinds through run_supervised, which stops the running bench.run and its workers.
    sys.exit(128 + signum)


def run_all(args, console: Console, runs: list[tuple[str, dict]]) -> list[dict]:
    """Each (label, run_one's keyword arguments) run to its end, --jobs at a time, records in order. A signal
    to parity (SystemExit from _exit_on_sigterm, or Ctrl-C) stops every run in flight with its workers."""
    def one(label: str, kwargs: dict) -> dict:
        console.print(f"{label} ...")
        record = run_one(args, **kwargs)
        console.print(f"  {label}: {record['status']} ({record.get('duration_s') or 0:.0f} s)")
        return record

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, label, kwargs) for label, kwargs in runs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            STOP.set()  # run_supervised's health check ends each run in flight, killing its process group
            raise


def _probe_runs(backend: str, workload: str, stamp: str, grad_accum: int | None = None) -> list[tuple[str, dict]]:
    """The reference run again from perturbed initial weights, once per PROBE_SEEDS (run_all's list)."""
    layout = Layout() if grad_accum else None
    return [(f"{workload} {backend} N=1, initial weights perturbed (draw {k})",
             {"backend": backend, "workload": workload, "devices": 1, "stamp": stamp, "probe": k, "layout": layout,
              "grad_accum": grad_accum or 1}) for k in pc.PROBE_SEEDS]


def _probes(args, backend: str, workload: str, stamp: str, console: Console, grad_accum: int | None = None
            ) -> list[dict]:
    return run_all(args, console, _probe_runs(backend, workload, stamp, grad_accum))


def _envelope(reference: dict | None, probes: list[dict]) -> list[float] | None:
    ok_probes = [pc.curve_of(p) for p in probes if p.get("status") == "ok"]
    return (pc.sensitivity(pc.curve_of(reference), ok_probes)
            if reference and ok_probes and len(ok_probes) == len(probes) else None)


def layout_parity(args, workload: str, stamp: str, console: Console) -> tuple[list[pc.Check], dict]:
    """Per backend, every layout against its 1-device run of the same global batch and micro-batches; the
    perturbed runs of each backend's first reference where a check needs them (--probes)."""
    references, done = {}, {}
    for backend in args.backends:
        references[backend] = {}
        for k in reference_accumulations(args.layouts):
            console.print(f"{workload} {backend} 1 device, {k} micro-batch(es) ...")
            ref = references[backend][k] = run_one(args, backend, workload, 1, stamp, layout=Layout(), grad_accum=k)
            console.print(f"  {ref['status']} ({ref.get('duration_s') or 0:.0f} s)")
        done[backend] = {}
        for layout in args.layouts:
            console.print(f"{workload} {backend} {layout.name} ({layout.devices} devices) ...")
            run = done[backend][layout.name] = run_one(args, backend, workload, layout.devices, stamp, layout=layout)
            console.print(f"  {run['status']} ({run.get('duration_s') or 0:.0f} s)")
    probes = dict.fromkeys(args.backends, None)
    checks = _layout_checks(workload, args.layouts, references, done, probes)
    if args.probes == "always" or pc.needs_sensitivity(checks):
        for backend, refs in references.items():
            first = min(refs)
            probes[backend] = _probes(args, backend, workload, stamp, console, first) \
                if refs[first].get("status") == "ok" else []
        checks = _layout_checks(workload, args.layouts, references, done, probes)
    runs = {backend: {"references": {str(k): r.get("run_id") for k, r in references[backend].items()},
                      "layouts": {n: r.get("run_id") for n, r in done[backend].items()},
                      "probes": [p.get("run_id") for p in probes[backend] or []]} for backend in args.backends}
    return checks, runs


def _layout_checks(workload: str, layouts: list[Layout], references: dict[str, dict[int, dict]],
                   done: dict[str, dict[str, dict]], probes: dict[str, list[dict] | None]) -> list[pc.Check]:
    """Every backend's layouts against its references, and against the first backend's, within the
    tolerances its probes measured (None: not run, rounding alone)."""
    checks, ran, envelopes = [], {}, {}
    for backend, refs in references.items():
        first = refs[min(refs)]
        got = probes[backend]
        checks.append(pc.probe_check(workload, backend if first.get("status") == "ok" else None, got or [],
                                     needed=got is not None))
        envelope, weights = _envelope(first, got or []), pc.weights_sensitivity(first, got or [])
        for layout in layouts:
            checks += pc.layout_checks(workload, f"{backend} {layout.name}", refs[layout.accumulation()],
                                       done[backend][layout.name], envelope, weights=weights)
        ran[backend] = {**{f"1 device x{k}": r for k, r in refs.items()}, **done[backend]}
        envelopes[backend] = (envelope, weights)
    return checks + cross_framework_checks(workload, ran, envelopes)


def cross_framework_checks(workload: str, ran: dict[str, dict[str, dict]],
                           envelopes: dict[str, tuple[list[float] | None, float | None]]) -> list[pc.Check]:
    """Every other backend's run of each layout (and each 1-device reference) against the first backend's run of
    the same: the same layout computes the same thing in every framework, within the first backend's measured
    sensitivity."""
    first, *others = list(ran)
    return [check for other in others for name, run in ran[other].items() if name in ran[first]
            for check in pc.layout_checks(workload, f"{other} {name}", ran[first][name], run, envelopes[first][0],
                                          against=f"{first} {name}", weights=envelopes[first][1])]


def all_data_parallel_runs(args, stamp: str, console: Console) -> tuple[dict[tuple[str, str, int], dict],
                                                                          dict[str, list[dict]]]:
    """Every (workload, backend, devices) run, and with --probes always per workload the probes of the first
    backend (the reference unless it fails at 1 device), from one queue: --jobs runs stay busy to the last, with
    no wait for a workload's reference before its probes start, nor for one workload before the next."""
    keys, runs = [], []
    for workload in args.workloads:
        for backend in args.backends:
            for devices in (1, 2):
                keys.append((workload, backend, devices))
                runs.append((f"{workload} {backend} N={devices}",
                             {"backend": backend, "workload": workload, "devices": devices, "stamp": stamp}))
        for k, probe in enumerate(_probe_runs(args.backends[0], workload, stamp) if args.probes == "always" else []):
            keys.append((workload, "probe", k))
            runs.append(probe)
    done = dict(zip(keys, run_all(args, console, runs)))
    probes = {w: [r for (workload, kind, _), r in done.items() if workload == w and kind == "probe"]
              for w in args.workloads}
    return {key: r for key, r in done.items() if key[1] != "probe"}, probes


def data_parallel_parity(args, workload: str, one: dict[str, dict], two: dict[str, dict],
                         queued_probes: list[dict], stamp: str, console: Console) -> tuple[list[pc.Check], list[dict]]:
    """The checks of one workload's runs at 1 and 2 devices, and the probes they were held to. The first backend
    that ran is the reference; its perturbed runs measure the tolerance, where a curve needs more than
    rounding (--probes auto) or always; `queued_probes`: those all_data_parallel_runs made already."""
    reference = next((b for b, r in one.items() if r.get("status") == "ok"), None)
    spec = model_spec(workload, "tiny")

    def checks_within(probes: list[dict] | None) -> list[pc.Check]:
        envelope = _envelope(one.get(reference), probes or [])
        return [*pc.run_status_checks(workload, one), pc.probe_check(workload, reference, probes or [],
                                                                      needed=probes is not None),
                *pc.cross_backend_checks(workload, spec.param_count(), training_flops_per_sample(spec), one, two,
                                         reference, envelope),
                *pc.data_parallel_checks(workload, one, two, envelope)]

    if reference is None:
        return checks_within([]), []
    if args.probes == "auto":
        checks = checks_within(None)
        if not pc.needs_sensitivity(checks):
            return checks, []
    probes = queued_probes if queued_probes and reference == args.backends[0] else \
        _probes(args, reference, workload, stamp, console)
    return checks_within(probes), probes


def default_backends(parser: OneLineParser, args) -> list[str]:
    """With --layouts, the registry's backend that runs every layout; without, every other backend (that one's
    data parallel is the dp2 of --layouts)."""
    if args.layouts:
        return [default_layout_backend(parser, "checks")]
    return [b for b in backend_names() if b != layout_backend()]


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.backends = args.backends or default_backends(parser, args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    console = Console(stderr=True)
    checks, runs = [], {}
    done, first_probes = ({}, {}) if args.layouts else all_data_parallel_runs(args, stamp, console)
    for workload in args.workloads:
        if args.layouts:
            workload_checks, runs[workload] = layout_parity(args, workload, stamp, console)
            checks += workload_checks
            continue
        one = {b: done[(workload, b, 1)] for b in args.backends}
        two = {b: done[(workload, b, 2)] for b in args.backends}
        workload_checks, probes = data_parallel_parity(args, workload, one, two, first_probes[workload], stamp,
                                                       console)
        checks += workload_checks
        runs[workload] = {str(n): {b: r.get("run_id") for b, r in group.items()} for n, group in ((1, one), (2, two))}
        runs[workload]["probes"] = [p.get("run_id") for p in probes]
    print_table(checks)
    line = pc.summary_line(checks)
    write_json_atomic(Path(args.out) / "parity.json", {
        "summary": line, "data": args.data, "steps": args.steps, "per_device_batch": args.batch_size,
        "layouts": [lay.name for lay in args.layouts or []], "probes": args.probes,
        "global_batch": 2 * args.batch_size, "seed": args.seed,
        "tolerances": {"step0_rtol": pc.STEP0_RTOL, "rounding_rtol": pc.ROUNDING_RTOL,
                       "probe_perturbation": pc.PROBE_PERTURBATION, "probe_seeds": list(pc.PROBE_SEEDS),
                       "sensitivity_factor": pc.SENSITIVITY_FACTOR},
        "runs": runs, "checks": [c.as_dict() for c in checks]})
    print(f"report {Path(args.out) / 'parity.json'}, records in {Path(args.out) / 'runs'}")
    print(line)
    return 0 if "HOLDS" in line else 1


if __name__ == "__main__":
    sys.exit(main())
