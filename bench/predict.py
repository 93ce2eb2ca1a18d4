"""python -m bench.predict --from RESULTS --hardware NAME|FILE --devices 8,64,512 --layouts dp,fsdp,tp2xdp,pp4-1f1b
                          [--workload mlm] [--model-size base] [--batch-size B | --global-batch B]
                          [--precision amp] [--assume-mfu 0.4]
python -m bench.predict --validate RESULTS [--hardware NAME|FILE]
python -m bench.predict --model llama3-8b --hardware h100-sxm-8 --devices 8,128 --layouts fsdp-sel (decoders)
python -m bench.predict --constants | --published [--json FILE]

Predicts a training step of each layout at each device count on the hardware described (step time, samples/s,
efficiency, memory per rank, whether it fits, the exposed communication and bubble), from a 1-device run
measured on that kind of device or from an MFU the user states, labelled as an assumption. --validate
predicts every multi-device run of a results folder from its 1-device runs and link probes, prints predicted
against measured, and writes RESULTS/validation.json. The model: common/predict (docs/prediction.md).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench import predict_decoders
from bench.cli import OneLineParser, int_list, positive_float, positive_int, workload_names
from bench.reporting import validation as validation_report
from bench.reporting.prediction_plot import prediction_plot
from bench.reporting.prediction_table import prediction_table
from common.config import PRECISIONS
from common.config_key import efficiency
from common.errors import BadInput
from common.layout import Layout, check_name
from common.peak_flops import device_model
from common.predict import hardware as hardware_files
from common.predict.basis import MEASURE_THE_SPLIT, Basis, accumulation, from_mfu
from common.predict.step import predict
from common.predict.validation import basis_of, execution, references, validate
from common.results import load_records, write_atomic, write_json_atomic
from common.spec import BERT_SIZES, DEFAULTS, BertSpec, model_spec
from common.stage_split import layers_per_stage

DEFAULT_CPU_HARDWARE = "cpu-loopback-2core"
GIB = 2**30


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--validate", metavar="RESULTS", help="predict every multi-device run of RESULTS from its "
                   "1-device runs and link probes; print and write RESULTS/validation.json")
    p.add_argument("--from", dest="source", metavar="RESULTS",
                   help="results folder whose 1-device run on the --hardware's kind of device gives the compute")
    p.add_argument("--hardware", metavar="NAME|FILE",
                   help=f"a bundled description ({', '.join(hardware_files.available())}) or a TOML file of "
                        f"yours (common/predict/hardware/README.md); --validate defaults to {DEFAULT_CPU_HARDWARE}")
    p.add_argument("--devices", type=int_list, default=[8, 64, 512], help="device counts (default 8,64,512)")
    p.add_argument("--layouts", default="dp,fsdp,tp2xdp,tp8xdp,pp4-1f1b",
                   help="layout names (docs/layouts.md); a bare dp or fsdp takes the devices the rest leave")
    p.add_argument("--workload", choices=workload_names(), default="mlm")
    p.add_argument("--model-size", choices=sorted(BERT_SIZES), default="base")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=positive_int, metavar="B",
                       help="per-device batch at every device count (weak scaling; default: the workload's, 32 "
                            "for the MLM); the compute comes from the measured 1-device run of the batch nearest it")
    batch.add_argument("--global-batch", type=positive_int,
                       help="one global batch at every device count (strong scaling)")
    p.add_argument("--assume-mfu", type=positive_float, metavar="MFU",
                   help="compute at this fraction of the device's datasheet peak instead of a measured run "
                        "(labelled as an assumption in every table and figure)")
    p.add_argument("--precision", choices=PRECISIONS, default="amp",
                   help="the precision predicted: the measured run's (default amp: bf16 autocast), with "
                        "--assume-mfu the math mode whose peak the MFU is of")
    p.add_argument("--out", help="folder for the figure and predictions.json (default: --from's folder, "
                                 "else ./predictions)")
    predict_decoders.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(width=200)
    try:
        if args.validate:
            return run_validation(console, Path(args.validate), args.hardware or DEFAULT_CPU_HARDWARE)
        decoders = predict_decoders.dispatch(console, args)
        if decoders is not None:
            return decoders
        if not args.hardware:
            parser.error("--hardware is needed to predict (or --validate RESULTS)")
        if not args.source and args.assume_mfu is None:
            parser.error("give --from RESULTS (a measured 1-device run) or --assume-mfu MFU")
        return run_prediction(console, args)
    except (ValueError, BadInput) as exc:
        parser.error(str(exc))
    return 2


# -- validation ------------------------------------------------------------------------------------------

def run_validation(console: Console, results: Path, hardware_name: str) -> int:
    if not (results / "runs").is_dir():
        raise ValueError(f"--validate {results}: no runs/ folder of run records there")
    hardware = hardware_files.load(hardware_name)
    result = validate(load_records(results), hardware)
    if not result["runs"] and not result["skipped"]:
        raise ValueError(f"--validate {results}: no ok multi-device run to predict")
    write_json_atomic(results / validation_report.FILE, result)
    table = Table(title=f"predicted vs measured, {results}", title_justify="left")
    for column in validation_report.COLUMNS:
        table.add_column(column, overflow="fold")
    for row in validation_report.rows(result):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    if validation_report.repeated(result):
        configs = Table(title="each configuration's repeats as one (medians)", title_justify="left")
        for column in validation_report.CONFIG_COLUMNS:
            configs.add_column(column, overflow="fold")
        for row in validation_report.config_rows(result):
            configs.add_row(*(escape(cell) for cell in row))
        console.print(configs)
    for skipped in result["skipped"]:
        console.print(f"left out: {skipped['run_id']}: {escape(skipped['why'])}")
    console.print(validation_report.summary_line(result, str(results / validation_report.FILE)))
    return 0


# -- prediction ------------------------------------------------------------------------------------------

def _device_kind_of(record: dict) -> str:
    """A record's device: 'cpu', or the GPU model common.peak_flops knows it by."""
    if record.get("device_kind") != "cuda":
        return str(record.get("device_kind"))
    gpus = (record.get("host") or {}).get("gpus") or []
    found = device_model(gpus[0] if gpus else None)
    return found[0] if found else "cuda"


def _target_kind(hardware) -> str:
    if hardware.device_kind != "cuda":
        return hardware.device_kind
    found = device_model(hardware.device_name)
    return found[0] if found else "cuda"


def layout_bases(results: Path, hardware, main: dict, basis: Basis) -> Callable[[Layout], Basis]:
    """Per layout, the basis `--validate` would predict a run of it from (validation.references): RESULTS' 1-device
    runs of the layout's micro-batches and --recompute where they hold them (on a CPU a micro-batch of 8
    sequences runs faster per sample than one of 32: the tiny MLM at 4 micro-batches of 32 took 559 ms a step
    against 650 ms at one), else `basis` (main's)."""
    usable = _usable(results, hardware, main["workload"])
    spec = model_spec(main["workload"], (main.get("config") or {}).get("model_size") or "tiny")
    cache: dict[tuple, Basis] = {}

    def basis_for(layout: Layout) -> Basis:
        run = {**main, "devices": layout.devices, "layout": asdict(layout),
               "config": {**(main.get("config") or {}), "grad_accum": 1}}
        refs = references(run, usable)
        ids = tuple(r["run_id"] for r in refs)
        if not refs or ids == basis.record_ids:
            return basis
        return cache.setdefault(ids, basis_of(spec, refs, usable))
    return basis_for


def _one_device_runs(results: Path, workload: str) -> list[dict]:
    """RESULTS' ok 1-device runs of the workload that measured a step."""
    return [r for r in load_records(results) if r.get("status") == "ok" and r.get("devices") == 1
            and r.get("workload") == workload and (r.get("step_time_s") or {}).get("p50")]


def _usable(results: Path, hardware, workload: str) -> list[dict]:
    """Those of them on the hardware's kind of device."""
    target = _target_kind(hardware)
    return [r for r in _one_device_runs(results, workload) if _device_kind_of(r) == target]


def measured_basis(results: Path, hardware, workload: str, size: str, precision: str = "amp",
                   batch: int | None = None) -> tuple[Basis, dict]:
    """The basis from RESULTS' 1-device runs on the hardware's kind of device; ValueError (one line) when
    there is none, naming the devices the folder does hold. Of those, the main run is torch_3d's (it runs
    the layouts), of the size and precision asked for, plain (no --recompute, no --compile), of the
    per-device `batch` or the nearest to it, the latest; its runs of the same batch at other micro-batch
    counts give the per-micro-batch cost."""
    target = _target_kind(hardware)
    usable = _usable(results, hardware, workload)
    if not usable:
        held = sorted({_device_kind_of(r) for r in _one_device_runs(results, workload)}) or ["none"]
        raise ValueError(f"{results} has no 1-device {workload} run on {target} (its runs: {', '.join(held)}); "
                         f"compute measured on one kind of device does not predict {hardware.name}: "
                         "pass --assume-mfu MFU to predict from an assumed utilisation")

    def preference(r: dict) -> tuple:
        config = r.get("config") or {}
        off = abs(math.log(r["global_batch"] / batch)) if batch else 0.0
        return (r["backend"] != "torch_3d", config.get("model_size") != size,
                (config.get("precision") or "fp32") != precision, any(execution(r)), accumulation(r) != 1, off)
    usable.sort(key=lambda r: r.get("started_at") or "", reverse=True)   # the latest first among equals
    usable.sort(key=preference)
    main = usable[0]
    spec = model_spec(workload, (main.get("config") or {}).get("model_size") or "tiny")
    refs = references(main, usable) or [main]
    return basis_of(spec, refs, usable), main


def measured_peak(results: Path, hardware, precision: str) -> float | None:
    """The latest achievable matmul peak (record["achievable_peak"]) a run in RESULTS measured on the
    hardware's kind of device at `precision`; None when none did."""
    target = _target_kind(hardware)
    found = [r for r in load_records(results) if r.get("status") == "ok" and _device_kind_of(r) == target
             and (r.get("config") or {}).get("precision") == precision
             and ((r.get("achievable_peak") or {}).get("flops_per_s"))]
    found.sort(key=lambda r: r.get("started_at") or "")
    return float(found[-1]["achievable_peak"]["flops_per_s"]) if found else None


def run_prediction(console: Console, args) -> int:
    hardware = hardware_files.load(args.hardware)
    spec = model_spec(args.workload, args.model_size)
    source = Path(args.source) if args.source else None
    per_device = args.batch_size or DEFAULTS[args.workload].per_device_batch
    if args.assume_mfu is not None:
        achievable = measured_peak(source, hardware, args.precision) if source else None
        basis = from_mfu(args.assume_mfu, hardware, args.precision, achievable)
        backend = "torch_3d"
    else:
        basis, main = measured_basis(source, hardware, args.workload, args.model_size, args.precision,
                                     args.global_batch // min(args.devices) if args.global_batch else per_device)
        backend = main["backend"]
        precision = (main.get("config") or {}).get("precision") or "fp32"
        if precision != args.precision:
            basis = _relabel(basis, f"; measured at {precision}, not {args.precision} (none of that precision)")
        if not args.global_batch and main["global_batch"] != per_device:
            basis = _relabel(basis, f"; measured at batch {main['global_batch']}, predicted at {per_device} per "
                                    "device by multiply-adds (an assumption: pass --batch-size to use a measured one)")
        measured_size = (main.get("config") or {}).get("model_size")
        if args.workload == "mlm" and measured_size != args.model_size:
            basis = _relabel(basis, f"; measured at size {measured_size}, scaled to {args.model_size} by "
                                    "multiply-adds (an assumption)")
    validation = validation_report.load(source) if source else None
    rests_on = (validation_report.summary_line(validation, str(source / validation_report.FILE)) if validation
                else "Not validated: " + (f"no {validation_report.FILE} in {source} (run bench.predict --validate "
                                          f"{source})." if source else "no results folder given (--from)."))
    if basis.assumed:
        rests_on += " The compute is ASSUMED (--assume-mfu), not measured: the validation does not cover it."
    names = [e.strip() for e in args.layouts.split(",") if e.strip()]
    for name in names:
        check_name(name)
    rows = []
    for n in args.devices:
        batch = args.global_batch or per_device * n
        one = _one_device_rate(spec, batch / n, basis, hardware, backend)
        for name in names:
            rows.append(_row(spec, name, n, batch, basis, hardware, backend, one))
    out = Path(args.out) if args.out else (source if source else Path("predictions"))
    title = (f"{args.workload} {args.model_size} on {hardware.name}: predicted per layout\n"
             f"{basis.label}")
    slug = f"predict-{args.workload}-{args.model_size}-{hardware.name}"
    _print(console, rows, hardware, basis, rests_on, title)
    plot = prediction_plot(rows, hardware.memory_bytes, title, rests_on, slug)
    written = [write_atomic(out / "plots" / f"{slug}.png", plot.png()),
               write_json_atomic(out / f"{slug}.json", {"hardware": hardware.name, "hardware_file": hardware.path,
                                                         "compute": basis.label, "assumed": basis.assumed,
                                                         "validation": rests_on, "workload": args.workload,
                                                         "model_size": args.model_size, "rows": rows})]
    console.print(f"figure: {written[0]}; table: {written[1]}")
    return 0


def _relabel(basis: Basis, extra: str) -> Basis:
    return replace(basis, label=basis.label + extra)


def _one_device_rate(spec, per_device_batch: float, basis: Basis, hardware, backend: str) -> float:
    """Samples/s of one device at the per-device batch: what N devices are held against (efficiency)."""
    return predict(spec, Layout(), per_device_batch, hardware, basis, backend).samples_per_s


def _row(spec, name: str, devices: int, batch: int, basis: Basis, hardware, backend: str, one: float) -> dict:
    row = {"layout": name, "devices": devices, "global_batch": batch}
    try:
        layout = Layout.parse(name, devices)
        layout.validate(spec, batch)
        # Layers per stage as torch_3d would place them (--stage-split even, auto or counts).
        split = layers_per_stage(layout.stage_split, spec, layout.pp, batch // layout.data) \
            if layout.pp > 1 and isinstance(spec, BertSpec) else None
        p = predict(spec, layout, batch, hardware, basis, backend, stage_split=split)
    except (ValueError, BadInput) as exc:
        return {**row, "invalid": str(exc)}
    memory = p.memory_per_rank or p.model_per_rank
    return {**row, "layout_full": layout.name, "step_s": p.step_s, "samples_per_s": p.samples_per_s,
            "efficiency": efficiency(p.samples_per_s, devices, one), "memory_per_rank_max": max(memory),
            "state_per_rank_max": max(s.total for s in p.state_per_rank), "fits": p.fits(hardware.memory_bytes),
            "comm_exposed_share": p.comm_exposed_s / p.step_s, "bubble_share": p.bubble_s / p.step_s,
            "parts_s": p.parts_s,
            "collectives": [asdict(c) for c in p.collectives], "notes": p.notes,
            **({"layers_per_stage": split} if split else {})}


def _print(console: Console, rows: list[dict], hardware, basis: Basis, rests_on: str, title: str) -> None:
    columns = ("as", "step (ms)", "samples/s", "efficiency", "memory/rank (GiB)", "fits", "exposed comm", "bubble")
    console.print(prediction_table(title, rests_on, columns, rows, lambda r: [
        r["layout_full"], f"{r['step_s'] * 1e3:,.1f}", f"{r['samples_per_s']:,.0f}", f"{r['efficiency']:.2f}",
        f"{r['memory_per_rank_max'] / GIB:,.2f}", "yes" if r["fits"] else "NO", f"{r['comm_exposed_share']:.0%}",
        f"{r['bubble_share']:.0%}"]))
    for n in sorted({r["devices"] for r in rows}):
        fitting = [r for r in rows if r["devices"] == n and r.get("fits")]
        best = max(fitting, key=lambda r: r["samples_per_s"], default=None)
        console.print(f"best at {n} devices: " + (f"{best['layout_full']} ({best['samples_per_s']:,.0f} samples/s)"
                                                  if best else "no layout fits"))
    console.print(f"hardware: {hardware.name} ({hardware.path}); compute: {escape(basis.label)}")
    if basis.guesses:
        console.print(f"GUESSED: {escape('; '.join(basis.guesses))}; {MEASURE_THE_SPLIT}")


if __name__ == "__main__":
    sys.exit(main())
