"""bench.predict's decoder-LLM part (--model, --constants, --published): a training step of a decoder (GPT-3,
Megatron's GPT, Llama 3) under the layouts large models train with, on a GPU cluster, computed from first
principles (common/predict/step.py, kernels.py), and the model held against published GPU-cluster results.

python -m bench.predict --model llama3-8b --hardware h100-sxm-8 --devices 8,128 --layouts fsdp-sel,tp2xfsdp-sp
python -m bench.predict --constants
python -m bench.predict --published [--json FILE]
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.reporting.prediction_plot import prediction_plot
from bench.reporting.prediction_table import prediction_table
from bench.reporting.published_plot import FILE as published_file
from bench.reporting.published_plot import published_plot
from common.layout import Layout, check_name
from common.predict import constants, decoder, stacks
from common.predict import hardware as hardware_files
from common.predict import published as published_points
from common.predict.kernels import compute_label, device_compute
from common.predict.step import predict
from common.results import write_atomic, write_json_atomic

GIB = 2**30


def add_arguments(p) -> None:
    p.add_argument("--model", metavar="NAME|FILE",
                   help=f"a decoder LLM ({', '.join(decoder.available())}) or a TOML file of yours "
                        "(common/predict/models/README.md): predict its step under --layouts on --hardware's GPUs "
                        "from first principles (docs/prediction-at-scale.md)")
    p.add_argument("--stack", choices=sorted(stacks.STACKS), default="megatron-te",
                   help="with --model: the software running the step (kernels, fusions, optimizer)")
    p.add_argument("--constants", action="store_true", help="print every constant the GPU-cluster model uses, "
                   "with its source, and exit")
    p.add_argument("--published", action="store_true",
                   help="predict every published GPU-cluster result (common/predict/published/) and print "
                        "predicted against published with the error")
    p.add_argument("--json", metavar="FILE", help="with --published: write the points and errors here")


def dispatch(console: Console, args) -> int | None:
    """Run the LLM part when asked; None: not ours."""
    if args.constants:
        return run_constants(console, args)
    if args.published:
        return run_published(console, args)
    if args.model:
        return run_model(console, args)
    return None


def run_constants(console: Console, args) -> int:
    names = [args.hardware] if args.hardware else None
    table = Table(title="bench.predict's GPU-cluster constants", title_justify="left")
    for column in ("constant", "value", "unit", "source"):
        table.add_column(column, overflow="fold")
    for c in constants.table(names):
        table.add_row(escape(c.name), escape(c.value), c.unit, escape(c.source))
    console.print(table)
    return 0


def run_published(console: Console, args) -> int:
    result = published_points.check()
    table = Table(title="predicted against published GPU-cluster results", title_justify="left")
    for column in ("point", "metric", "published", "predicted", "error", "on every table measured", "layout as "
                   "modelled", "source"):
        table.add_column(column, overflow="fold")
    for r in result["points"]:
        if r.get("refused"):
            table.add_row(escape(r["name"]), r["metric"], f"{r['published']:g}", "refused", "", "",
                          escape(r["refused"].split(": ", 1)[-1]), escape(r["source"].split(":")[0]))
            continue
        others = [r["error"], *r["error_by_table"].values()]
        table.add_row(escape(r["name"]), r["metric"], f"{r['published']:g}", _figure(r["predicted"]),
                      f"{r['error']:+.1%}", f"{min(others):+.1%} to {max(others):+.1%}",
                      escape(r["layout_full"] + " " + r["stack"]), escape(r["source"].split(":")[0]))
    console.print(table)
    tables = max((len(t) for t in result["tables"].values()), default=0)
    console.print(f"{result['predicted']} points predicted, {result['refused']} refused: median |error| "
                  f"{result['median_abs_error']:.1%}, largest {result['max_abs_error']:.1%} on the bundled tables; "
                  f"each point's worst over every table measured of its part ({tables} of the H100): median "
                  f"{result['worst_median_abs_error']:.1%}, largest {result['worst_max_abs_error']:.1%}")
    for g in result["rankings"]:
        rho = "n/a" if g["spearman"] is None else f"{g['spearman']:+.2f}"
        console.print(f"ranking {g['model']} on {g['devices']} x {g['hardware']}: Spearman {rho}; order of "
                      f"points more than 10% apart {'holds' if g['order_holds'] else 'DOES NOT hold'} "
                      f"({len(g['points'])} points)")
    out = Path(args.out) if args.out else Path("predictions")
    path = Path(args.json) if args.json else out / published_file
    written = [write_json_atomic(path, result), write_atomic(out / "plots" / "predicted-vs-published.png",
                                                             published_plot(result).png())]
    console.print(f"table: {written[0]}; figure: {written[1]}")
    return 0


def _figure(value: float) -> str:
    return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"


def run_model(console: Console, args) -> int:
    if args.precision != "amp":
        raise ValueError(f"--model predicts bf16 mixed precision (--precision amp), not {args.precision}: fp8 and "
                         "fp32 are not modelled")
    if not args.hardware:
        raise ValueError("--model needs --hardware (a GPU description with a compute table: "
                         f"{', '.join(constants.gpu_hardware())})")
    hardware = hardware_files.load(args.hardware)
    spec = decoder.load(args.model)
    stack = stacks.load(args.stack)
    compute = device_compute(hardware, args.assume_mfu)
    label = compute_label(compute)
    names = [e.strip() for e in args.layouts.split(",") if e.strip()]
    for name in names:   # what no device count can change is refused before anything is predicted
        check_name(name)
    rows = [_row(spec, name, n, args, hardware, stack, compute) for n in args.devices for name in names]
    title = f"{spec.name} on {hardware.name} ({stack.name}): predicted per layout\n{label}"
    caption = ("Checked against published GPU-cluster results: python -m bench.predict --published "
               "(docs/prediction-at-scale.md).")
    _print(console, rows, title, caption)
    out = Path(args.out) if args.out else Path("predictions")
    slug = f"predict-{spec.name}-{hardware.name}"
    plot = prediction_plot(rows, hardware.memory_bytes, title, caption, slug)
    written = [write_atomic(out / "plots" / f"{slug}.png", plot.png()),
               write_json_atomic(out / f"{slug}.json", {"model": spec.name, "hardware": hardware.name,
                                                       "stack": stack.name, "compute": label,
                                                       "assumed": args.assume_mfu is not None, "rows": rows})]
    console.print(f"figure: {written[0]}; table: {written[1]}")
    return 0


def _row(spec, name: str, devices: int, args, hardware, stack, compute) -> dict:
    row = {"layout": name, "devices": devices}
    try:
        layout = Layout.parse(name, devices)
        batch = args.global_batch or layout.data * (args.batch_size or 1)
        p = predict(spec, layout, batch, hardware, compute, stack=stack)
    except ValueError as exc:
        return {**row, "invalid": str(exc)}
    return {**row, "layout_full": layout.name, "global_batch": batch, "step_s": p.step_s,
            "samples_per_s": batch / p.step_s, "tokens_per_s_per_device": batch * spec.seq_len / p.step_s / devices,
            "memory_per_rank_max": p.memory_max, "fits": p.fits(hardware.memory_bytes),
            "comm_exposed_share": p.comm_exposed_s / p.step_s, "bubble_share": p.bubble_s / p.step_s,
            "parts_s": p.parts_s}


def _print(console: Console, rows: list[dict], title: str, caption: str) -> None:
    columns = ("as", "batch", "step (s)", "tokens/s/device", "memory/rank (GiB)", "fits", "exposed comm", "bubble")
    console.print(prediction_table(title, caption, columns, rows, lambda r: [
        r["layout_full"], str(r["global_batch"]), f"{r['step_s']:.3f}", f"{r['tokens_per_s_per_device']:,.0f}",
        f"{r['memory_per_rank_max'] / GIB:,.1f}", "yes" if r["fits"] else "NO", f"{r['comm_exposed_share']:.0%}",
        f"{r['bubble_share']:.0%}"]))
