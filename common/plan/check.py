"""The goals nox -s plan-check holds a plan to against exhaustive measurement (pick, ranking, fit; docs/plan.md,
"Proven by exhaustion"): pure functions of a plan document whose rows carry what was measured."""
from __future__ import annotations

import math

from common.plan.fit import GIB, error_allowed
from common.stats import spearman

PICK_WITHIN = 0.05
MIN_SPEARMAN = 0.8


def fit_limits(plan: dict) -> list[float]:
    """Memory limits in GiB at which the planner's fit calls change, from the plan's predicted peaks P and its
    memory error e alone (docs/plan.md, "Proven by exhaustion")."""
    e = error_allowed(plan.get("memory_error"))
    peaks = [r["memory_per_rank_max"] for r in plan["rows"] if r.get("memory_per_rank_max")]
    mib = {math.floor(min(peaks) / 2**20)} if peaks else set()
    mib |= {math.ceil(p / (1 + e) / 2**20) - 1 for p in peaks}
    return [m / 1024 for m in sorted(mib) if m > 0]


def fit_goal(limited: list[dict]) -> dict:
    """The "does not fit" calls of the plans made under fit_limits, each held against what its layout measured."""
    calls = [(r, plan["available_bytes"]) for plan in limited for r in plan["rows"] if r["fit"] == "does not fit"]
    peak = {r["layout"]: (r.get("measured") or {}).get("peak_per_rank_max") for r, _ in calls}
    wrong = sorted({f"{r['layout']} (measured {peak[r['layout']] / GIB:.3f} GiB, limit {limit / GIB:.3f})"
                    for r, limit in calls if peak[r["layout"]] is not None and peak[r["layout"]] <= limit})
    unmeasured = sorted({r["layout"] for r, _ in calls if peak[r["layout"]] is None})
    margins = [(peak[r["layout"]] / limit, r["layout"], limit) for r, limit in calls if peak[r["layout"]]]
    closest = min(margins, default=None)
    return {"limits": len(limited), "calls": len(calls), "layouts_called": len(peak), "wrong": wrong,
            "unmeasured": unmeasured,
            "closest": None if closest is None else {"layout": closest[1], "limit_bytes": closest[2],
                                                     "measured_over_limit": closest[0]},
            "holds": bool(calls) and not wrong and not unmeasured}


def goals(plan: dict, limited: list[dict]) -> dict:
    """Each goal's figures and whether it holds. `plan`: made under no binding memory limit, its rows carrying
    `measured` (the pick and the ranking); `limited`: the same plan under each of fit_limits (the fit calls)."""
    measured = [r for r in plan["rows"] if (r.get("measured") or {}).get("samples_per_s")]
    best = max(measured, key=lambda r: r["measured"]["samples_per_s"], default=None)
    pick = next((r for r in measured if r["layout"] == plan.get("pick")), None)
    ratio = pick["measured"]["samples_per_s"] / best["measured"]["samples_per_s"] if pick and best else None
    rho = spearman([r["step_s"] for r in measured], [r["measured"]["step_s"] for r in measured])
    return {
        "pick": {"layout": plan.get("pick"), "measured_best": best["layout"] if best else None,
                 "pick_samples_per_s": pick["measured"]["samples_per_s"] if pick else None,
                 "best_samples_per_s": best["measured"]["samples_per_s"] if best else None,
                 "ratio": ratio, "holds": ratio is not None and ratio >= 1 - PICK_WITHIN},
        "ranking": {"spearman": rho, "configurations": len(measured),
                    "holds": rho is not None and rho >= MIN_SPEARMAN},
        "fit": fit_goal(limited),
    }
