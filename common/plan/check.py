"""The goals the planner is held to by exhaustive measurement (nox -s plan-check, docs/plan.md): pure functions
of a plan document whose rows carry what was measured.

  pick       the planner's pick (no memory limit binding) measures within PICK_WITHIN of the fastest layout measured
  ranking    Spearman's rank correlation of predicted and measured step time over every layout measured
             >= MIN_SPEARMAN (ties take their average rank)
  fit        under a tight memory limit, the plan calls some layouts "does not fit", and every one of them
             measured a peak above the limit (a goal no call could meet is not held to have been met)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

PICK_WITHIN = 0.05
MIN_SPEARMAN = 0.8


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks; None for fewer than three pairs or a constant."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = pd.Series(x).rank(method="average"), pd.Series(y).rank(method="average")
    if rx.nunique() < 2 or ry.nunique() < 2:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def goals(plan: dict, limited: dict) -> dict:
    """Each goal's figures and whether it holds. `plan`: made under no binding memory limit, its rows carrying
    `measured` (the pick and the ranking); `limited`: the same plan under a tight limit (the fit calls)."""
    measured = [r for r in plan["rows"] if (r.get("measured") or {}).get("samples_per_s")]
    best = max(measured, key=lambda r: r["measured"]["samples_per_s"], default=None)
    pick = next((r for r in measured if r["layout"] == plan.get("pick")), None)
    ratio = pick["measured"]["samples_per_s"] / best["measured"]["samples_per_s"] if pick and best else None
    rho = spearman([r["step_s"] for r in measured], [r["measured"]["step_s"] for r in measured])
    limit = limited["available_bytes"]
    called = [r for r in limited["rows"] if r["fit"] == "does not fit"]
    wrong = [r["layout"] for r in called if (r.get("measured") or {}).get("peak_per_rank_max") is not None
             and r["measured"]["peak_per_rank_max"] <= limit]
    unmeasured = [r["layout"] for r in called if (r.get("measured") or {}).get("peak_per_rank_max") is None]
    return {
        "pick": {"layout": plan.get("pick"), "measured_best": best["layout"] if best else None,
                 "pick_samples_per_s": pick["measured"]["samples_per_s"] if pick else None,
                 "best_samples_per_s": best["measured"]["samples_per_s"] if best else None,
                 "ratio": ratio, "holds": ratio is not None and ratio >= 1 - PICK_WITHIN},
        "ranking": {"spearman": rho, "configurations": len(measured),
                    "holds": rho is not None and rho >= MIN_SPEARMAN},
        "fit": {"limit_bytes": limit, "called_does_not_fit": len(called), "wrong": wrong, "unmeasured": unmeasured,
                "holds": bool(called) and not wrong and not unmeasured},
    }
