"""A plan measured: its layouts run with bench.compare (bench.plan --run: the top K; nox -s plan-check: all of
them), each row given what its runs measured, with the intervals bench.compare --repeats computes."""
from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.cli import console_table
from bench.reporting.plan import COLUMNS as PLAN_COLUMNS
from bench.reporting.plan import PLANS_DIR, plan_rows
from common.layout import Layout
from common.predict.basis import measured_memory
from common.results import load_records, write_json_atomic
from common.stats import Interval, throughput_interval


def compare_command(plan: dict, names: list[str], out: str, steps: int | None = None, warmup: int | None = None,
                    repeats: int = 1, data: str = "auto", extra: tuple[str, ...] = ()) -> list[str]:
    """bench.compare over `names` at the plan's global batch, backend, size and precision."""
    cmd = [sys.executable, "-m", "bench.compare", "--layouts", ",".join(names), "--backends", plan["backend"],
           "--workloads", plan["workload"], "--model-size", plan["model_size"], "--batch-size",
           str(plan["global_batch"]), "--precision", plan["precision"], "--repeats", str(repeats), "--data", data,
           "--out", out, *extra]
    cmd += ["--steps", str(steps)] if steps else []
    cmd += ["--warmup-steps", str(warmup)] if warmup else []
    cmd += ["--skip-eval"] if plan["skip_eval"] else []
    return cmd


def attach_measured(plan: dict, records: list[dict]) -> dict:
    """The plan with each row's measured figures (those of `records` that ran its layout) and a summary."""
    runs: dict[str, list[dict]] = {}
    for r in records:
        if (r.get("workload"), r.get("backend"), r.get("devices"), r.get("global_batch")) == \
                (plan["workload"], plan["backend"], plan["devices"], plan["global_batch"]) and r.get("layout") \
                and (plan["workload"] != "mlm" or (r.get("config") or {}).get("model_size") == plan["model_size"]):
            runs.setdefault(Layout.from_record(r["layout"]).name, []).append(r)
    for row in plan["rows"]:
        found = runs.get(row["layout"], [])
        ok = [r for r in found if r.get("status") == "ok" and r.get("step_times_s")]
        if not ok:
            row["measured"] = {"status": found[-1]["status"], "samples_per_s": None} if found else None
            continue
        speed = throughput_interval([r["step_times_s"] for r in ok], plan["global_batch"])
        peaks = [v for r in ok for v in measured_memory(r, "process_peak_per_rank") if v is not None]
        row["measured"] = {"status": "ok", "runs": len(ok), "run_ids": [r["run_id"] for r in ok],
                           "samples_per_s": speed.value, "low": speed.low, "high": speed.high,
                           "step_s": statistics.median(r["step_time_s"]["p50"] for r in ok),
                           "peak_per_rank_max": max(peaks) if peaks else None}
    measured = sorted((r for r in plan["rows"] if (r.get("measured") or {}).get("samples_per_s")),
                      key=lambda r: -r["measured"]["samples_per_s"])
    for i, r in enumerate(measured, 1):
        r["measured"]["rank"] = i
    plan["measured"] = {"summary": _summary(plan, measured)} if measured else None
    return plan


def _interval(row: dict) -> Interval:
    m = row["measured"]
    return Interval(m["samples_per_s"], m["low"], m["high"])


def _summary(plan: dict, measured: list[dict]) -> str:
    best = measured[0]
    pick = next((r for r in measured if r["layout"] == plan["pick"]), None)
    text = f"Measured: fastest {best['layout']} ({best['measured']['samples_per_s']:,.1f} samples/s)"
    if pick is not None and pick is not best:
        text += (f"; the pick {pick['layout']} measured {pick['measured']['samples_per_s']:,.1f} "
                 f"({pick['measured']['samples_per_s'] / best['measured']['samples_per_s']:.1%} of it, "
                 f"{pick['measured']['rank']} of {len(measured)})")
    elif pick is best:
        text += ", the plan's pick"
    same = [r["layout"] for r in measured[1:] if _interval(r).overlaps(_interval(best))]
    if same:
        text += f"; inside the fastest's 95% interval, so not separable by this measurement: {', '.join(same)}"
    return text + "."


def measure(console: Console, plan: dict, args) -> dict:
    """bench.plan --run: the top K that may fit, run with bench.compare into --out; the plan written to
    OUT/plans/ beside the records, with what they measured."""
    names = [r["layout"] for r in plan["rows"] if r["rank"] and r["rank"] <= args.top]
    out = Path(args.out)
    before = {r["run_id"] for r in load_records(out)}
    limit = ("--memory-per-device", f"{args.memory_per_device:g}") if args.memory_per_device else ()
    cmd = compare_command(plan, names, str(out), args.steps, args.warmup_steps, args.repeats, args.data, limit)
    console.print(f"running the top {len(names)}: {' '.join(cmd[1:])}")
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"bench.plan: error: bench.compare exited {done.returncode}")
    plan = attach_measured(plan, [r for r in load_records(out) if r["run_id"] not in before])
    show_measured(console, plan)
    slug = f"plan-{plan['workload']}-{plan['model_size']}-{plan['backend']}-n{plan['devices']}"
    path = write_json_atomic(out / PLANS_DIR / f"{slug}.json", plan)
    console.print(f"plan with its measurements: {path} (bench.report shows it)")
    return plan


def show_measured(console: Console, plan: dict) -> None:
    console.print(console_table(f"{plan['title']}: predicted against measured", PLAN_COLUMNS,
                                plan_rows([r for r in plan["rows"] if r.get("measured")])))
    if plan.get("measured"):
        console.print(escape(plan["measured"]["summary"]))
