"""The plan document (what bench.plan prints, writes with --json and, with --run or nox -s plan-check, leaves in
RESULTS/plans/) and the report's plan section: the ranked layouts, the measured points beside them where the
plan was run."""
from __future__ import annotations

import json
from pathlib import Path

from bench.reporting.document import Block, Heading, Table, Text
from common.plan.fit import GIB
from common.plan.rank import Ranked
from common.plan.space import Space

PLANS_DIR = "plans"


def _row(r: Ranked, explanation: str, spec_split: list[int] | None) -> dict:
    p = r.prediction
    return {"rank": r.rank, "layout": r.layout.name, "step_s": r.step_s, "samples_per_s": p.samples_per_s,
            "memory_per_rank_max": r.memory, "memory_per_rank": p.memory_per_rank or p.model_per_rank,
            "fit": r.fit, "parts_s": r.parts, "separable": r.separable,
            "decides": [[part, s] for part, s in r.decides], "explanation": explanation, "auto_split": r.auto_split,
            **({"layers_per_stage": spec_split} if spec_split else {})}


def document(args, hardware, basis: str, available: float, step_error: float | None, mem_error: float | None,
             space: Space, rows: list[Ranked], explanations: list[str], batch: int) -> dict:
    from common.plan.fit import stage_split_of
    from common.spec import model_spec

    spec = model_spec(args.workload, args.model_size)
    ranked = [r for r in rows if r.rank]
    pick = ranked[0] if ranked else None
    tied = [r.layout.name for r in ranked[1:] if r.separable is False or abs(r.step_s / pick.step_s - 1) <= 1e-9]
    limit = (f"--memory-per-device {args.memory_per_device:g} GiB" if args.memory_per_device
             else f"{hardware.name}'s memory")
    reasons = sorted(space.reasons().items(), key=lambda kv: -kv[1])
    summary = [f"space: {len(space.valid)} valid layouts of {args.devices} devices for {args.backend}; "
               f"{len(space.refused)} candidates refused"
               + (" (" + "; ".join(f"{n} x {why}" for why, n in reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
                  + ")" if reasons else "")]
    dropped = [r for r in rows if r.fit == "does not fit"]
    maybe = [r for r in ranked if r.fit == "may not fit"]
    allowance = f", allowing the model's measured memory error {mem_error:.0%}" if mem_error else \
        " (no measured memory error: point predictions)"
    summary.append(f"memory: {limit}, {available / GIB:,.2f} GiB per device{allowance}: {len(dropped)} predicted "
                   f"not to fit (dropped), {len(maybe)} may not fit (kept, flagged)")
    if pick:
        summary.append(f"pick: {pick.layout.name}, predicted {pick.prediction.samples_per_s:,.1f} samples/s "
                       f"({pick.step_s * 1e3:,.0f} ms a step), {pick.memory / GIB:,.2f} GiB on its fullest rank")
        if step_error is None:
            summary.append("ranking error unknown (no validation of the model on this kind of machine): the order "
                           "rests on point predictions")
        elif tied:
            summary.append(f"not separable from the pick within the ranking error {step_error:.1%}: "
                           f"{', '.join(tied)}; measure them (bench.plan --run --repeats 3) to choose")
        else:
            summary.append(f"the pick is ahead of every other layout by more than the ranking error {step_error:.1%}")
    else:
        summary.append("no layout is predicted to fit")
    return {"title": f"{args.workload} {args.model_size} on {args.devices} x {hardware.name} ({args.backend}), "
                     f"global batch {batch}", "workload": args.workload, "model_size": args.model_size,
            "devices": args.devices, "backend": args.backend, "global_batch": batch, "hardware": hardware.name,
            "precision": args.precision, "skip_eval": bool(args.skip_eval), "basis": basis,
            "available_bytes": available, "memory_limit": limit, "ranking_error": step_error,
            "memory_error": mem_error, "candidates": {"valid": len(space.valid), "refused": len(space.refused),
                                                      "reasons": space.reasons()},
            "pick": pick.layout.name if pick else None, "not_separable": tied, "summary": summary,
            "rows": [_row(r, e, stage_split_of(spec, r.layout, batch)) for r, e in zip(rows, explanations)],
            "measured": None}


def load_plans(results: Path) -> list[dict]:
    plans = []
    for path in sorted((Path(results) / PLANS_DIR).glob("*.json")):
        try:
            plans.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return plans


def _measured_cell(row: dict) -> str:
    m = row.get("measured")
    if not m:
        return ""
    if m.get("samples_per_s") is None:
        return m.get("status", "")
    text = f"{m['samples_per_s']:,.1f}"
    if m.get("low") is not None:
        text += f" [{m['low']:,.1f}, {m['high']:,.1f}]"
    return text


COLUMNS = ["#", "layout", "step predicted (ms)", "samples/s predicted", "samples/s measured [95% interval]",
           "measured rank", "memory/rank predicted (GiB)", "peak/rank measured (GiB)", "fits", "what decides"]


def plan_rows(plan: dict) -> list[list[str]]:
    body = []
    for r in plan["rows"]:
        m = r.get("measured") or {}
        body.append([str(r["rank"] or "-"), r["layout"], f"{r['step_s'] * 1e3:,.0f}", f"{r['samples_per_s']:,.1f}",
                     _measured_cell(r), str(m.get("rank") or ""), f"{r['memory_per_rank_max'] / GIB:,.2f}",
                     f"{m['peak_per_rank_max'] / GIB:,.2f}" if m.get("peak_per_rank_max") else "", r["fit"],
                     r["explanation"]])
    return body


def plan_blocks(results: Path) -> list[Block]:
    plans = load_plans(results)
    if not plans:
        return []
    blocks: list[Block] = [Heading("Plans: layouts chosen without trial runs", 2),
                           Text("Each plan (`bench.plan`, docs/plan.md) predicts every valid layout of its devices, "
                                "drops those predicted not to fit and ranks the rest by predicted step; where the "
                                "plan was run (`--run`, `nox -s plan-check`) the measured samples/s stand beside "
                                "the predicted ones.")]
    for plan in plans:
        shown = [r for r in plan["rows"] if r.get("measured") or (r["rank"] and r["rank"] <= 10)]
        blocks += [Heading(plan["title"], 3), Text(plan["basis"] + ". " + " ".join(plan["summary"])
                                                   + (" " + plan["measured"]["summary"] if plan.get("measured")
                                                      else "")),
                   Table(COLUMNS, plan_rows({**plan, "rows": shown}))]
    return blocks
