"""python -m bench.plan_check [--out DIR] [--sizes tiny,mini] [--steps 24] [--warmup-steps 4] [--repeats R] [--reuse]

bench.plan proven by exhaustion (nox -s plan-check; tens of minutes, not in CI): every layout the planner
enumerates for torch_3d on 2 devices measured with bench.compare for each size, and the plan made from each
folder's 1-device runs held to common.plan.check's goals, its allowances from validating the OTHER size's runs,
never the runs it is checked against. Exits 1 when a goal fails. docs/plan.md, "Proven by exhaustion"."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from bench.cli import OneLineParser, name_list, positive_int
from bench.plan import DEFAULT_HARDWARE, make_plan
from bench.plan_run import attach_measured, compare_command
from bench.plan_space import backend_refusal
from bench.reporting.plan import PLANS_DIR
from common.plan.check import MIN_SPEARMAN, PICK_WITHIN, fit_limits, goals
from common.plan.fit import GIB
from common.plan.space import enumerate_layouts
from common.predict import hardware as hardware_files
from common.predict.validation import validate
from common.results import load_records, write_json_atomic
from common.spec import BERT_SIZES

DEVICES, BATCH, MICRO_BATCHES, BACKEND = 2, 32, (2, 4, 8), "torch_3d"


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.plan_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/plan-check", help="one folder per size under it")
    p.add_argument("--sizes", type=name_list(tuple(BERT_SIZES)), default=["tiny", "mini"])
    # 20 measured steps: the tiny model's layouts differ by less than 8 steps' spread (Spearman 0.684 with 8,
    # 0.789 with 20 on the same machine, docs/plan.md).
    p.add_argument("--steps", type=positive_int, default=24)
    p.add_argument("--warmup-steps", type=positive_int, default=4)
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="measure every configuration R times, the rows interleaved (bench.compare --repeats)")
    p.add_argument("--reuse", action="store_true",
                   help="measure nothing: check against the records already in each size's folder")
    return p


def plan_args(size: str, source: Path, memory_gib: float | None) -> argparse.Namespace:
    return argparse.Namespace(hardware=DEFAULT_HARDWARE, source=str(source), assume_mfu=None, workload="mlm",
                              model_size=size, global_batch=BATCH, micro_batches=list(MICRO_BATCHES),
                              memory_per_device=memory_gib, devices=DEVICES, backend=BACKEND, precision="fp32",
                              skip_eval=True)


def layouts(size: str) -> list[str]:
    hardware = hardware_files.load(DEFAULT_HARDWARE)
    refuse = backend_refusal(BACKEND, "mlm", size, DEVICES, BATCH, "fp32", hardware)
    return [lay.name for lay in enumerate_layouts(BERT_SIZES[size], DEVICES, BATCH, MICRO_BATCHES, refuse).valid]


def measure(size: str, folder: Path, args) -> None:
    names = layouts(size)
    cmd = compare_command({"backend": BACKEND, "workload": "mlm", "model_size": size, "global_batch": BATCH,
                           "precision": "fp32", "skip_eval": True}, names, str(folder), args.steps,
                          args.warmup_steps, args.repeats, data="real",
                          # --profile: how tensor parallelism divides the 1-device runs' compute (work.ComputeShares)
                          extra=("--breakdown-steps", "2", "--threads-per-device", "1", "--profile", "2"))
    print(f"plan-check {size}: measuring {len(names)} layouts and their 1-device runs: {' '.join(cmd[1:])}",
          flush=True)
    subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False)


def load_figures(records: list[dict]) -> str:
    busy = [b for r in records if (b := (r.get("load") or {}).get("other_busy_cores")) is not None]
    avg = [a for r in records if (a := (r.get("load") or {}).get("loadavg_1m_before")) is not None]
    if not busy:
        return "load: not recorded"
    return (f"load while measuring: other programs' busy cores median {statistics.median(busy):.2f}, largest "
            f"{max(busy):.2f} (of {(records[0].get('host') or {}).get('cores')}); 1-minute load average before a "
            f"run median {statistics.median(avg):.1f}, largest {max(avg):.1f}; "
            f"{records[0]['started_at']} to {records[-1]['started_at']}")


def check(size: str, folder: Path, other: dict) -> tuple[dict, dict, str]:
    """The plan under no binding limit (the pick, the ranking) and under each limit at which its fit calls change,
    each given what the folder measured; the goals; the load while it measured."""
    records = sorted(load_records(folder), key=lambda r: r.get("started_at") or "")
    plan = attach_measured(make_plan(plan_args(size, folder, None), validation=other), records)
    limited = [attach_measured(make_plan(plan_args(size, folder, gib), validation=other), records)
               for gib in fit_limits(plan)]
    plan["check"] = goals(plan, limited)
    plan["fit_plans"] = [{"available_bytes": p["available_bytes"],
                          "does_not_fit": [r["layout"] for r in p["rows"] if r["fit"] == "does not fit"]}
                         for p in limited]
    write_json_atomic(folder / PLANS_DIR / f"plan-check-mlm-{size}.json", plan)
    return plan, plan["check"], load_figures([r for r in records if r.get("status") == "ok"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    folders = {size: out / f"mlm-{size}" for size in args.sizes}
    if not args.reuse:
        for size, folder in folders.items():
            measure(size, folder, args)
    # A size checked alone takes its allowances from another size's folder an earlier check left under --out.
    validated = {**folders, **{size: out / f"mlm-{size}" for size in BERT_SIZES
                               if size not in folders and (out / f"mlm-{size}" / "runs").is_dir()}}
    validations = {size: validate(load_records(folder), hardware_files.load(DEFAULT_HARDWARE))
                   for size, folder in validated.items()}
    lines, ok = [], True
    for size, folder in folders.items():
        other = next((s for s in validations if s != size), None)
        plan, result, load = check(size, folder, validations[other] if other else {})
        allowed = f"the {other} runs' validation, {validated[other]}" if other else "no other size's runs: none allowed"
        pick, rank, fit = result["pick"], result["ranking"], result["fit"]
        ok = ok and pick["holds"] and rank["holds"] and fit["holds"]
        lines += [f"== mlm {size}, {DEVICES} devices, global batch {BATCH}: {rank['configurations']} layouts "
                  f"measured ({folder})", load,
                  f"pick {pick['layout']}: measured {_fmt(pick['pick_samples_per_s'], ',.1f')} samples/s; measured "
                  f"best {pick['measured_best']}: {_fmt(pick['best_samples_per_s'], ',.1f')}; ratio "
                  f"{_fmt(pick['ratio'], '.1%')} (goal >= {1 - PICK_WITHIN:.0%}): {_verdict(pick['holds'])}",
                  f"Spearman(predicted, measured step) over {rank['configurations']}: "
                  f"{_fmt(rank['spearman'], '.3f')} (goal >= {MIN_SPEARMAN}): {_verdict(rank['holds'])}",
                  f"under {fit['limits']} memory limits (each layout's tightest 'does not fit' limit P/(1+e), and "
                  f"the smallest predicted peak): {fit['calls']} calls 'does not fit' on {fit['layouts_called']} "
                  f"layouts, of which measured within their limit: {', '.join(fit['wrong']) or 'none'}; not "
                  f"measured: {', '.join(fit['unmeasured']) or 'none'}; closest: {_closest(fit['closest'])}: "
                  f"{_verdict(fit['holds'])}",
                  f"errors allowed (from {allowed}): ranking "
                  f"{_fmt(plan['ranking_error'], '.1%')}, memory {_fmt(plan['memory_error'], '.1%')}"]
    print("\n".join(lines))
    print("PLAN CHECK HOLDS" if ok else "PLAN CHECK FAILS")
    return 0 if ok else 1


def _closest(closest: dict | None) -> str:
    if closest is None:
        return "n/a"
    return (f"{closest['layout']} measured {closest['measured_over_limit']:.2f}x the "
            f"{closest['limit_bytes'] / GIB:.3f} GiB limit")


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _verdict(holds: bool) -> str:
    return "holds" if holds else "FAILS"


if __name__ == "__main__":
    sys.exit(main())
