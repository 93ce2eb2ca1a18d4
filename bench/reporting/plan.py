"""The report's plan section: each plan bench.plan --run or nox -s plan-check left in RESULTS/plans/, its ranked
layouts with the measured points beside them."""
from __future__ import annotations

import json
from pathlib import Path

from bench.reporting.document import Block, Heading, Table, Text
from common.plan.fit import GIB

PLANS_DIR = "plans"


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
