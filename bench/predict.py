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

from bench.cli import OneLineParser, check_model_size, console_table, int_list, positive_float, positive_int
from bench.reporting import published_plot as published_table
from bench.reporting import validation as validation_report
from bench.reporting.prediction_plot import prediction_plot
from common.config import PRECISIONS
from common.config_key import efficiency
from common.errors import BadInput
from common.layout import Layout, check_name
from common.peak_flops import device_model
from common.plan.fit import GIB, stage_split_of
from common.predict import constants, decoder, stacks
from common.predict import hardware as hardware_files
from common.predict import published as published_points
from common.predict.basis import MEASURE_THE_SPLIT, Basis, accumulation, from_mfu
from common.predict.executed import WORKLOADS as EXECUTED_WORKLOADS
from common.predict.kernels import compute_label, device_compute
from common.predict.step import predict
from common.predict.validation import basis_of, execution, references, validate
from common.results import load_records, write_atomic, write_json_atomic
from common.spec import BERT_SIZES, DEFAULTS, model_spec

DEFAULT_HARDWARE = "cpu-loopback-2core"   # this development VM: --validate's default, and bench.plan's


def add_compute_options(p: OneLineParser, decoders, hardware: str | None, model_size: str) -> None:
    """What bench.predict and bench.plan predict and from what compute: the model (a workload and size, or on
    `decoders`' group a decoder and its stack), the hardware, and the compute's source."""
    p.add_argument("--hardware", default=hardware, metavar="NAME|FILE",
                   help=f"a bundled description ({', '.join(hardware_files.available())}) or a TOML file of yours "
                        "(common/predict/hardware/README.md); default "
                        f"{hardware or DEFAULT_HARDWARE + ' with --validate, else none'}")
    p.add_argument("--from", dest="source", metavar="RESULTS",
                   help="results folder whose 1-device run on the --hardware's kind of device gives the compute")
    p.add_argument("--assume-mfu", type=positive_float, metavar="MFU",
                   help="compute at this fraction of the device's datasheet peak instead of a measured run "
                        "(labelled as an assumption in every table and figure)")
    p.add_argument("--workload", choices=EXECUTED_WORKLOADS, default="mlm")
    p.add_argument("--model-size", choices=sorted(BERT_SIZES), default=model_size)
    decoders.add_argument("--model", metavar="NAME|FILE", help=f"a decoder LLM ({', '.join(decoder.available())}) "
                          "or a TOML file of yours (common/predict/models/README.md)")
    decoders.add_argument("--stack", choices=sorted(stacks.STACKS), default="megatron-te",
                          help="with --model: the software running the step (kernels, fusions, tensor-parallel "
                               "overlap, optimizer)")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--validate", metavar="RESULTS", help="predict every multi-device run of RESULTS from its "
                   "1-device runs and link probes; print and write RESULTS/validation.json")
    d = p.add_argument_group("decoder LLMs on GPU clusters, from a compute table (docs/prediction-at-scale.md)")
    add_compute_options(p, d, None, "base")
    p.add_argument("--devices", type=int_list, default=[8, 64, 512], help="device counts (default 8,64,512)")
    p.add_argument("--layouts", default="dp,fsdp,tp2xdp,tp8xdp,pp4-1f1b",
                   help="layout names (docs/layouts.md); a bare dp or fsdp takes the devices the rest leave")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=positive_int, metavar="B",
                       help="per-device batch at every device count (weak scaling; default: the workload's, 32 "
                            "for the MLM); the compute comes from the measured 1-device run of the batch nearest it")
    batch.add_argument("--global-batch", type=positive_int,
                       help="one global batch at every device count (strong scaling)")
    p.add_argument("--precision", choices=PRECISIONS, default="amp",
                   help="the precision predicted: the measured run's (default amp: bf16 autocast), with "
                        "--assume-mfu the math mode whose peak the MFU is of")
    p.add_argument("--out", help="folder for the figure and predictions.json (default: --from's folder, "
                                 "else ./predictions)")
    d.add_argument("--constants", action="store_true", help="print every constant the GPU-cluster model uses, "
                   "with its source, and exit")
    d.add_argument("--published", action="store_true",
                   help="predict every published GPU-cluster result (common/predict/published/) and print "
                        "predicted against published with the error")
    d.add_argument("--json", metavar="FILE", help="with --published: write the points and errors here")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(width=200)
    try:
        if args.validate:
            return run_validation(console, Path(args.validate), args.hardware or DEFAULT_HARDWARE)
        if args.constants:
            return run_constants(console, args)
        if args.published:
            return run_published(console, args)
        if not args.hardware:
            parser.error("--hardware is needed to predict (or --validate RESULTS)")
        if not args.model and not args.source and args.assume_mfu is None:
            parser.error("give --from RESULTS (a measured 1-device run) or --assume-mfu MFU")
        return run_prediction(console, args)
    except (ValueError, BadInput) as exc:
        parser.error(str(exc))
    return 2


# -- validation ------------------------------------------------------------------------------------------

def run_validation(console: Console, results: Path, hardware_name: str) -> int:
    if not (results / "runs").is_dir():
        raise ValueError(f"--validate {results}: no runs/ folder of run records there")
    result = validate(load_records(results), hardware_files.load(hardware_name))
    if not result["runs"] and not result["skipped"]:
        raise ValueError(f"--validate {results}: no ok multi-device run to predict")
    write_json_atomic(results / validation_report.FILE, result)
    console.print(console_table(f"predicted vs measured, {results}", validation_report.COLUMNS,
                                validation_report.rows(result)))
    if validation_report.repeated(result):
        console.print(console_table("each configuration's repeats as one (medians)", validation_report.CONFIG_COLUMNS,
                                    validation_report.config_rows(result)))
    for skipped in result["skipped"]:
        console.print(f"left out: {skipped['run_id']}: {escape(skipped['why'])}")
    console.print(validation_report.summary_line(result, str(results / validation_report.FILE)))
    return 0


# -- prediction ------------------------------------------------------------------------------------------

def _kind(device_kind: str | None, name: str | None) -> str:
    """A device: 'cpu', or the GPU model common.peak_flops knows it by."""
    found = device_model(name) if device_kind == "cuda" else None
    return found[0] if found else str(device_kind)


def _device_kind_of(record: dict) -> str:
    return _kind(record.get("device_kind"), ((record.get("host") or {}).get("gpus") or [None])[0])


def measured_basis(results: Path, hardware, workload: str, size: str, precision: str,
                   batch: int) -> tuple[Basis, dict, Callable[[Layout], Basis]]:
    """The basis from RESULTS' 1-device runs on the hardware's kind of device (ValueError naming the devices the
    folder does hold where there is none): the main run is torch_3d's (it runs the layouts), of the size and
    precision asked for, plain, of the per-device `batch` or the nearest to it, the latest; that run; and per layout
    the basis `--validate` would predict a run of it from: RESULTS' 1-device runs of its micro-batches and
    --recompute where held (on a CPU a micro-batch of 8 runs faster per sample than one of 32), else the main one's."""
    target = _kind(hardware.device_kind, hardware.device_name)
    ones = [r for r in load_records(results) if r.get("status") == "ok" and r.get("devices") == 1
            and r.get("workload") == workload and (r.get("step_time_s") or {}).get("p50")]
    usable = [r for r in ones if _device_kind_of(r) == target]
    if not usable:
        held = sorted({_device_kind_of(r) for r in ones}) or ["none"]
        raise ValueError(f"{results} has no 1-device {workload} run on {target} (its runs: {', '.join(held)}); "
                         f"compute measured on one kind of device does not predict {hardware.name}: "
                         "pass --assume-mfu MFU to predict from an assumed utilisation")

    def preference(r: dict) -> tuple:
        config = r.get("config") or {}
        return (r["backend"] != "torch_3d", config.get("model_size") != size,
                (config.get("precision") or "fp32") != precision, any(execution(r)), accumulation(r) != 1,
                abs(math.log(r["global_batch"] / batch)))
    ranked = sorted(usable, key=lambda r: r.get("started_at") or "", reverse=True)   # the latest first among equals
    ranked.sort(key=preference)
    main = ranked[0]
    spec = model_spec(workload, (main.get("config") or {}).get("model_size") or "tiny")
    basis = basis_of(spec, references(main, ranked) or [main], ranked)

    def basis_for(layout: Layout) -> Basis:
        run = {**main, "devices": layout.devices, "layout": asdict(layout),
               "config": {**(main.get("config") or {}), "grad_accum": 1}}
        refs = references(run, usable)
        return basis_of(spec, refs, usable) if refs else basis
    return basis, main, basis_for


def chosen_basis(args, hardware, source: Path | None, batch: int) -> tuple[Basis, dict | None, Callable | None]:
    """With --assume-mfu, from_mfu's basis at the latest achievable matmul peak a run in `source` measured on the
    hardware's kind of device (where one did), and no main run nor per-layout bases; else measured_basis's."""
    if args.assume_mfu is None:
        return measured_basis(source, hardware, args.workload, args.model_size, args.precision, batch)
    target = _kind(hardware.device_kind, hardware.device_name)
    found = sorted((r for r in (load_records(source) if source else []) if r.get("status") == "ok"
                    and _device_kind_of(r) == target and (r.get("config") or {}).get("precision") == args.precision
                    and (r.get("achievable_peak") or {}).get("flops_per_s")), key=lambda r: r.get("started_at") or "")
    achievable = float(found[-1]["achievable_peak"]["flops_per_s"]) if found else None
    return from_mfu(args.assume_mfu, hardware, args.precision, achievable), None, None


def run_prediction(console: Console, args) -> int:
    """Every layout at every device count, of an executed workload or a decoder (--model): one table and figure."""
    hardware = hardware_files.load(args.hardware)
    spec, backend, stack, compute, rests_on = (_decoder if args.model else _executed)(args, hardware)
    what = spec.name if args.model else f"{args.workload}-{args.model_size}"
    label = compute_label(compute)
    names = [e.strip() for e in args.layouts.split(",") if e.strip()]
    for name in names:   # what no device count can change is refused before anything is predicted
        check_name(name)
    per_device = args.batch_size or (1 if args.model else DEFAULTS[args.workload].per_device_batch)
    rows = []
    for n in args.devices:
        # An executed workload's batch is per device; a decoder's per data-parallel rank (its tp and pp ranks
        # share their sequences).
        one = None if args.model else predict(spec, Layout(), args.global_batch / n if args.global_batch
                                               else per_device, hardware, compute, backend).samples_per_s
        rows += [_row(spec, name, n, args.global_batch, per_device, compute, hardware, backend, stack, one)
                 for name in names]
    title = f"{what} on {hardware.name}" + (f" ({stack.name})" if stack else "") + f": predicted per layout\n{label}"
    slug = f"predict-{what}-{hardware.name}"
    _print(console, rows, hardware, compute, rests_on, title, decoder_rows=bool(args.model))
    out = Path(args.out or (None if args.model else args.source) or "predictions")
    plot = prediction_plot(rows, hardware.memory_bytes, title, rests_on, slug)
    head = {"model": spec.name, "stack": stack.name} if args.model else \
        {"workload": args.workload, "model_size": args.model_size}
    written = [write_atomic(out / "plots" / f"{slug}.png", plot.png()),
               write_json_atomic(out / f"{slug}.json", {"hardware": hardware.name, "hardware_file": hardware.path,
                                                         "compute": label, "assumed": args.assume_mfu is not None,
                                                         "validation": rests_on, **head, "rows": rows})]
    console.print(f"figure: {written[0]}; table: {written[1]}")
    return 0


def _decoder(args, hardware):
    if args.precision != "amp":
        raise ValueError(f"--model predicts bf16 mixed precision (--precision amp), not {args.precision}: fp32 is "
                         "not modelled, fp8 is a stack's (--stack torch-compile-float8)")
    return decoder.load(args.model), "", stacks.load(args.stack), device_compute(hardware, args.assume_mfu), \
        ("Checked against published GPU-cluster results: python -m bench.predict --published "
         "(docs/prediction-at-scale.md).")


def _executed(args, hardware) -> tuple:
    check_model_size(args.workload, args.model_size)
    spec = model_spec(args.workload, args.model_size)
    source = Path(args.source) if args.source else None
    per_device = args.batch_size or DEFAULTS[args.workload].per_device_batch
    basis, main, _ = chosen_basis(args, hardware, source,
                                  args.global_batch // min(args.devices) if args.global_batch else per_device)
    if main:   # what the measured run differs in from what is predicted
        precision = (main.get("config") or {}).get("precision") or "fp32"
        extra = f"; measured at {precision}, not {args.precision} (none of that precision)" \
            if precision != args.precision else ""
        if not args.global_batch and main["global_batch"] != per_device:
            extra += (f"; measured at batch {main['global_batch']}, predicted at {per_device} per device by "
                      "multiply-adds (an assumption: pass --batch-size to use a measured one)")
        size = (main.get("config") or {}).get("model_size")
        if args.workload == "mlm" and size != args.model_size:
            extra += f"; measured at size {size}, scaled to {args.model_size} by multiply-adds (an assumption)"
        basis = replace(basis, label=basis.label + extra)
    return spec, main["backend"] if main else "torch_3d", None, basis, _rests_on(source, basis)


def _rests_on(source: Path | None, basis: Basis) -> str:
    validation = validation_report.load(source) if source else None
    text = (validation_report.summary_line(validation, str(source / validation_report.FILE)) if validation
            else "Not validated: " + (f"no {validation_report.FILE} in {source} (run bench.predict --validate "
                                      f"{source})." if source else "no results folder given (--from)."))
    if basis.assumed:
        text += " The compute is ASSUMED (--assume-mfu), not measured: the validation does not cover it."
    return text


def _row(spec, name: str, devices: int, global_batch: int | None, per_device: int, compute, hardware, backend: str,
         stack, one: float | None) -> dict:
    row = {"layout": name, "devices": devices}
    try:
        layout = Layout.parse(name, devices)
        batch = global_batch or (layout.data if stack else devices) * per_device
        row["global_batch"] = batch
        layout.validate(spec, batch)
        # Layers per stage as torch_3d would place them (--stage-split even, auto or counts).
        split = stage_split_of(spec, layout, batch)
        p = predict(spec, layout, batch, hardware, compute, backend, stack=stack)
    except (ValueError, BadInput) as exc:
        return {**row, "invalid": str(exc)}
    out = {**row, "layout_full": layout.name, "step_s": p.step_s, "samples_per_s": p.samples_per_s,
           "memory_per_rank_max": p.memory_max, "fits": p.fits(hardware.memory_bytes),
           "comm_exposed_share": p.comm_exposed_s / p.step_s, "bubble_share": p.bubble_s / p.step_s,
           "parts_s": p.parts_s, "collectives": [asdict(c) for c in p.collectives], "notes": p.notes}
    if stack:
        return {**out, "tokens_per_s_per_device": p.tokens_per_s / devices}
    return {**out, "efficiency": efficiency(p.samples_per_s, devices, one),
            "state_per_rank_max": max(s.total for s in p.state_per_rank),
            **({"layers_per_stage": split} if split else {})}


def _print(console: Console, rows: list[dict], hardware, compute, rests_on: str, title: str,
           decoder_rows: bool) -> None:
    """One row per layout and device count, a layout the model cannot predict saying why."""
    columns = ("layout", "N", "as", "batch", "step (ms)", "samples/s",
               "tokens/s/device" if decoder_rows else "efficiency", "memory/rank (GiB)", "fits", "exposed comm",
               "bubble")
    body = [[r["layout"], str(r["devices"]), *[""] * (len(columns) - 3), r["invalid"]] if "invalid" in r else
            [r["layout"], str(r["devices"]), r["layout_full"], str(r["global_batch"]), f"{r['step_s'] * 1e3:,.1f}",
             f"{r['samples_per_s']:,.1f}",
             f"{r['tokens_per_s_per_device']:,.0f}" if decoder_rows else f"{r['efficiency']:.2f}",
             f"{r['memory_per_rank_max'] / GIB:,.2f}", "yes" if r["fits"] else "NO", f"{r['comm_exposed_share']:.0%}",
             f"{r['bubble_share']:.0%}"] for r in rows]
    console.print(console_table(title, columns, body, rests_on))
    for n in sorted({r["devices"] for r in rows}):
        fitting = [r for r in rows if r["devices"] == n and r.get("fits")]
        best = max(fitting, key=lambda r: r["samples_per_s"], default=None)
        console.print(f"best at {n} devices: " + (f"{best['layout_full']} ({best['samples_per_s']:,.1f} samples/s)"
                                                  if best else "no layout fits"))
    console.print(f"hardware: {hardware.name} ({hardware.path}); compute: {escape(compute_label(compute))}")
    if getattr(compute, "guesses", None):
        console.print(f"GUESSED: {escape('; '.join(compute.guesses))}; {MEASURE_THE_SPLIT}")


def run_constants(console: Console, args) -> int:
    console.print(console_table("bench.predict's GPU-cluster constants", ("constant", "value", "unit", "source"),
                                [[c.name, c.value, c.unit, c.source]
                                 for c in constants.table([args.hardware] if args.hardware else None)]))
    return 0


def run_published(console: Console, args) -> int:
    result = published_points.check()
    console.print(console_table("predicted against published GPU-cluster results", published_table.COLUMNS,
                                published_table.rows(result)))
    console.print(console_table("refused, listed apart: not predicted, with why", published_table.REFUSED_COLUMNS,
                                published_table.refused_rows(result)))
    console.print(console_table("by GPU generation and by publisher", published_table.GROUP_COLUMNS,
                                published_table.group_rows(result)))
    tables = max((len(t) for t in result["tables"].values()), default=0)
    console.print(f"{result['predicted']} points predicted, {result['refused']} refused: "
                  f"{published_points.error_line(result)} ({tables} tables of the H100)")
    for g in result["groups"]:
        console.print(f"{g['by']} {published_table.group_line(g)}")
    for g in result["rankings"]:
        rho = "n/a" if g["spearman"] is None else f"{g['spearman']:+.2f}"
        console.print(f"ranking {g['model']} on {g['devices']} x {g['hardware']}: Spearman {rho}; order of "
                      f"points more than 10% apart {'holds' if g['order_holds'] else 'DOES NOT hold'} "
                      f"({len(g['points'])} points)")
    out = Path(args.out or "predictions")
    path = write_json_atomic(Path(args.json) if args.json else out / published_table.FILE, result)
    plot = write_atomic(out / "plots" / "predicted-vs-published.png", published_table.published_plot(result).png())
    console.print(f"table: {path}; figure: {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
