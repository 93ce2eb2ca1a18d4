"""python -m bench.plan --devices N [--hardware NAME|FILE] (--from RESULTS | --assume-mfu MFU) [--workload W]
                       [--model-size S] [--global-batch B] [--memory-per-device GIB] [--top K]
                       [--backend torch_3d|keras_jax] [--json FILE] [--run [--steps S] [--repeats R] [--out DIR]]
python -m bench.plan --model NAME|FILE --hardware GPU --devices N --global-batch B [--seq-len S] [--stack STACK]
                       [--memory-per-device GIB] [--top K] [--layout NAME] [--assume-mfu MFU] [--json FILE]
python -m bench.plan --published [--json FILE]

Which layout to run on N devices, chosen without trial runs (common.plan): every layout predicted by bench.predict's
model, those that do not fit dropped, the rest ranked with what decides between them; --run measures the top K;
--model plans a decoder LLM on a GPU cluster; --published ranks each published layout in its cluster's plan.
docs/plan.md."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.cli import OneLineParser, check_model_size, console_table, int_list, positive_float, positive_int
from bench.plan_space import backend_refusal
from bench.predict import DEFAULT_HARDWARE, add_compute_options, chosen_basis
from bench.reporting import validation as validation_report
from bench.reporting.document import markdown_table
from common.config import PRECISIONS
from common.errors import BadInput, Unsupported
from common.plan import decoders
from common.plan.fit import GIB, memory_limit, stage_split_of
from common.plan.rank import document, memory_error, predicted, rank, ranking_error
from common.plan.space import enumerate_layouts
from common.predict import hardware as hardware_files
from common.predict import published as published_points
from common.predict.validation import hardware_for, probed_links, validate
from common.results import load_records, write_json_atomic
from common.spec import DEFAULTS, model_spec


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=positive_int, help="devices to lay the model out on (>= 2)")
    d = p.add_argument_group("--model: a decoder LLM on a GPU cluster (the decoders' model, a device compute table)")
    add_compute_options(p, d, DEFAULT_HARDWARE, "tiny")
    p.add_argument("--global-batch", type=positive_int,
                   help="the global batch every layout trains (default: the workload's batch, 32 for the MLM)")
    p.add_argument("--micro-batches", type=int_list, metavar="K,K",
                   help="pipeline micro-batch counts to consider (default: every count the batch divides into)")
    p.add_argument("--memory-per-device", type=positive_float, metavar="GIB",
                   help="memory one device may use (default: the hardware description's)")
    p.add_argument("--top", type=positive_int, default=5, help="layouts to show (and to run with --run)")
    p.add_argument("--backend", choices=("torch_3d", "keras_jax"), default="torch_3d")  # those that execute layouts
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="as bench.run's (default fp32)")
    p.add_argument("--skip-eval", action="store_true",
                   help="the runs do not evaluate: memory without the evaluation's logits (passed on with --run)")
    p.add_argument("--json", metavar="FILE", help="write the ranked list, with the measured points after --run")
    d.add_argument("--seq-len", type=positive_int, help="the sequence length (default: the model file's)")
    d.add_argument("--layout", metavar="NAME", help="say where this layout stands (docs/layouts.md's grammar)")
    d.add_argument("--published", action="store_true",
                   help="every published run's layout ranked in the plan for its model, devices, batch, hardware and "
                        "stack, with how much faster the plan's pick is predicted (minutes: millions of layouts)")
    r = p.add_argument_group("--run: measure the top K with bench.compare (one global batch, strong scaling)")
    r.add_argument("--run", action="store_true", help="run the top K and print predicted against measured")
    r.add_argument("--steps", type=positive_int, help="bench.run's --steps")
    r.add_argument("--warmup-steps", type=positive_int, help="bench.run's --warmup-steps")
    r.add_argument("--repeats", type=positive_int, default=1, help="bench.compare's --repeats (intervals)")
    r.add_argument("--data", choices=("auto", "real", "synthetic"), default="auto", help="bench.run's --data")
    r.add_argument("--out", default="results", help="the sweep's results folder; the plan goes to OUT/plans/")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(width=200)
    executed = not (args.published or args.model)   # else decoder LLMs on GPU clusters
    if not executed:
        if not args.published and (args.devices is None or args.global_batch is None
                                   or args.hardware == DEFAULT_HARDWARE):
            parser.error("--model needs --devices, --global-batch and --hardware (a GPU with a compute table)")
    elif args.layout:
        parser.error("--layout goes with --model (a decoder's plan); an executed workload's plan runs with --run")
    elif args.devices is None:
        parser.error("the following arguments are required: --devices")
    elif args.devices < 2:
        parser.error("--devices 1: a plan lays a model out over 2 or more devices")
    elif not args.source and args.assume_mfu is None:
        parser.error("give --from RESULTS (a measured 1-device run) or --assume-mfu MFU")
    elif args.run and args.assume_mfu is not None:
        parser.error("--run measures on this machine: plan from its records (--from RESULTS), not --assume-mfu")
    try:
        plan = make_plan(args) if executed else _decoders(args)
    except (ValueError, BadInput, Unsupported) as exc:
        parser.error(str(exc))
    if args.published:
        console.print(published_markdown(plan))
    else:
        show(console, plan, args.top)
    if executed and args.run:
        from bench.plan_run import measure  # starts bench.compare: only when asked
        plan = measure(console, plan, args)
    if args.json:
        write_json_atomic(Path(args.json), plan)
        console.print(f"plan: {args.json}")
    asked = plan.get("asked") or {}
    if asked.get("fit") == "does not fit":
        parser.error(f"--layout {asked['layout']}: does not fit: predicted {asked['memory_per_rank_max'] / GIB:,.1f} "
                     f"GiB on its fullest rank, {plan['available_bytes'] / GIB:,.1f} GiB available")
    return 0


def make_plan(args, validation: dict | None = None) -> dict:
    """The plan document (common.plan.rank.document). `validation` gives the errors; None: --from's
    validation.json, else one computed now from --from's multi-device runs, else none."""
    hardware = hardware_files.load(args.hardware)
    check_model_size(args.workload, args.model_size)
    spec = model_spec(args.workload, args.model_size)
    batch = args.global_batch or DEFAULTS[args.workload].per_device_batch
    source = Path(args.source) if args.source else None
    basis, main, basis_for = chosen_basis(args, hardware, source, batch)
    where = "assumed"
    if main:
        records = [r for r in load_records(source) if r.get("device_kind") == hardware.device_kind]
        hardware, link = hardware_for({"devices": args.devices}, hardware, probed_links(records))
        where = (f"{main['backend']} 1-device run at global batch {main['global_batch']}, each layout from the "
                 f"1-device runs of its micro-batches and recompute where measured; {link}")
        if validation is None:
            validation, how = _validation(source, records, hardware)
            where += f"; errors from {how}"
        if validation:
            where += f" ({len(validation.get('runs', []))} runs validated)"
    available, limit = memory_limit(hardware, args.memory_per_device)
    space = enumerate_layouts(spec, args.devices, batch, args.micro_batches,
                              backend_refusal(args.backend, args.workload, args.model_size, args.devices, batch,
                                              args.precision, hardware))
    if not space.valid:
        raise ValueError(f"no layout of {args.devices} devices is valid for {args.workload} {args.model_size} at "
                         f"global batch {batch}: " + "; ".join(list(space.refused)[:3]))
    step_error, mem_error = ranking_error(validation), memory_error(validation)
    eval_batch = None if args.skip_eval else DEFAULTS[args.workload].eval_batch
    rows = rank(predicted(spec, space.valid, batch, hardware, basis, available, mem_error, basis_for,
                          backend=args.backend, eval_batch=eval_batch), step_error)
    head = {"workload": args.workload, "model_size": args.model_size, "devices": args.devices,
            "backend": args.backend, "global_batch": batch, "hardware": hardware.name, "precision": args.precision,
            "skip_eval": bool(args.skip_eval)}
    return {**document(f"{args.workload} {args.model_size} on {args.devices} x {hardware.name} ({args.backend}), "
                       f"global batch {batch}", head, rows, space, basis.label + f" ({where})", available, limit,
                       step_error, mem_error, split_of=lambda layout: stage_split_of(spec, layout, batch)),
            "measured": None}


def _decoders(args) -> dict:
    """--published's ranking, else --model's plan with the step model's error against the published runs."""
    if args.published:
        return decoders.published_ranking()
    result = decoders.decoder_plan(args.model, args.devices, args.global_batch, args.hardware, args.stack,
                                   args.seq_len, args.memory_per_device, args.assume_mfu, args.top, args.layout)
    e = published_points.check()
    result["model_error"] = {k: e[k] for k in ("predicted", "median_abs_error", "max_abs_error",
                                               "worst_median_abs_error", "worst_max_abs_error")}
    result["summary"].append(
        f"the step model against {e['predicted']} published GPU-cluster runs: {published_points.error_line(e)} "
        "(python -m bench.predict --published); the order it gives two layouts of one cluster is checked against "
        "no measurement")
    return result


def published_markdown(result: dict) -> str:
    return markdown_table(
        ["published run", "its layout", "rank in the plan", "of", "the plan's pick", "pick predicted faster by"],
        [[r["point"], f"`{r['published_layout']}`", str(r["rank"]) if r["rank"] else
          f"- ({r['fit']}: {r['published_memory_gib']:,.1f} GiB)", f"{r['fitting']:,}", f"`{r['pick']}`",
          f"{r['pick_faster']:+.1%}"] for r in result["points"]])


def _validation(source: Path, records: list[dict], hardware) -> tuple[dict | None, str]:
    saved = validation_report.load(source)
    if saved:
        return saved, f"{source / validation_report.FILE}"
    if any(r.get("status") == "ok" and (r.get("devices") or 1) > 1 for r in records):
        return validate(records, hardware), f"a validation of {source}'s multi-device runs, computed now"
    return None, "nowhere: no multi-device run in the folder to validate the model on (error unknown)"


def show(console: Console, plan: dict, top: int) -> None:
    """The top rows of a plan (and the layout asked about, where it stands elsewhere), then its summary."""
    decoder_plan = "model" in plan
    shown = [r for r in plan["rows"] if r["rank"] and r["rank"] <= top]
    rows = [[str(r["rank"] or "-"), r["layout"], f"{r['step_s'] * 1e3:,.0f}",
             f"{r['tokens_per_s_per_device']:,.0f}" if decoder_plan else f"{r['samples_per_s']:,.1f}",
             f"{r['memory_per_rank_max'] / GIB:,.2f}", r["fit"],
             *(f"{r['parts_s'][part] / r['step_s']:.0%}" for part in ("comm_exposed", "bubble", "recompute")),
             r["explanation"]]
            for r in shown + ([plan["asked"]] if plan.get("asked") and plan["asked"] not in shown else [])]
    console.print(console_table(f"{plan['title']}\n{plan['basis']}", (
        "#", "layout", "step (ms)", "tokens/s/device" if decoder_plan else "samples/s", "memory/rank (GiB)", "fits",
        "exposed comm", "bubble", "recompute", "what decides"), rows))
    for line in plan["summary"]:
        console.print(escape(line))


if __name__ == "__main__":
    sys.exit(main())
