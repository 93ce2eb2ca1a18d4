"""The report's plan section: each plan bench.plan --run or nox -s plan-check left in RESULTS/plans/, its ranked
layouts with the measured points beside them."""
from __future__ import annotations

from pathlib import Path

from bench.reporting.document import Block, Heading, Table, Text
from common.plan.fit import GIB
from common.results import load_records

PLANS_DIR = "plans"


def _measured_cell(m: dict) -> str:
    if m.get("samples_per_s") is None:
        return m.get("status", "")
    return f"{m['samples_per_s']:,.1f}" + (f" [{m['low']:,.1f}, {m['high']:,.1f}]" if m.get("low") is not None else "")


COLUMNS = ["#", "layout", "step predicted (ms)", "samples/s predicted", "samples/s measured [95% interval]",
           "measured rank", "memory/rank predicted (GiB)", "peak/rank measured (GiB)", "fits", "what decides"]


def plan_rows(rows: list[dict]) -> list[list[str]]:
    measured = [r.get("measured") or {} for r in rows]
    return [[str(r["rank"] or "-"), r["layout"], f"{r['step_s'] * 1e3:,.0f}", f"{r['samples_per_s']:,.1f}",
             _measured_cell(m), str(m.get("rank") or ""), f"{r['memory_per_rank_max'] / GIB:,.2f}",
             f"{m['peak_per_rank_max'] / GIB:,.2f}" if m.get("peak_per_rank_max") else "", r["fit"], r["explanation"]]
            for r, m in zip(rows, measured)]


def plan_blocks(results: Path) -> list[Block]:
    plans = load_records(results, PLANS_DIR)
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
                   Table(COLUMNS, plan_rows(shown))]
    return blocks
