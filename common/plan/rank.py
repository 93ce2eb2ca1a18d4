"""Each layout predicted (common.predict.step), what does not fit dropped, the rest ranked by predicted step with
what decides between them, separable only beyond the ranking error (docs/plan.md, "How each layout is predicted
and ranked")."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations

from common.layout import Layout
from common.plan.fit import GIB, verdict
from common.plan.space import Space
from common.predict.basis import Basis
from common.predict.gpu_compute import DeviceCompute
from common.predict.hardware import Hardware
from common.predict.prediction import Prediction
from common.predict.step import predict

# The parts of a predicted step, as the plan names them (compute is forward+backward less the recomputation).
PARTS = {"compute": "compute", "recompute": "recompute cost", "comm_exposed": "exposed communication",
         "bubble": "pipeline bubble", "optimizer": "optimizer", "sync_wait": "waiting for other ranks",
         "overhead": "per-step overhead"}
SAME = 1e-9  # predicted steps closer than this (relative) are the same prediction, e.g. GPipe and 1F1B


@dataclass
class Ranked:
    layout: Layout
    prediction: Prediction
    memory: float               # the predicted peak of the fullest rank (bytes)
    fit: str                    # common.plan.fit.verdict
    rank: int = 0               # 1 = the pick; 0: dropped (does not fit)
    separable: bool | None = None   # from the pick, beyond the ranking error (None: the error is unknown)
    decides: list[tuple[str, float]] = field(default_factory=list)  # parts that make it slower than the pick (s)

    @property
    def step_s(self) -> float:
        return self.prediction.step_s

    @cached_property   # its prediction is made once; decides() reads it part by part for every pair
    def parts(self) -> dict[str, float]:
        p = self.prediction
        return {part: getattr(p, f"{part}_s") for part in PARTS} | {"compute": p.compute_s - p.recompute_s}


def ranking_error(validation: dict | None) -> float | None:
    """The median |e_a - e_b| over pairs of a validation's runs (None: fewer than two runs validated)."""
    errors = [r["step_s"]["error"] for r in (validation or {}).get("runs", [])
              if r.get("step_s", {}).get("error") is not None]
    return statistics.median(abs(a - b) for a, b in combinations(errors, 2)) if len(errors) > 1 else None


def memory_error(validation: dict | None) -> float | None:
    """The largest |error| of the validation's memory per rank (None: none validated)."""
    summary = ((validation or {}).get("summary") or {}).get("all") or {}
    return (summary.get("memory_per_rank") or {}).get("max_abs_error")


def predicted(spec, layouts: list[Layout], global_batch: int, hardware: Hardware, compute: Basis | DeviceCompute,
              available: float, error: float | None, compute_for: Callable[[Layout], Basis] | None = None,
              **how) -> list[Ranked]:
    """Each layout predicted (`how`: predict()'s backend, eval_batch, stack), with its fit verdict against
    `available` bytes per device; `compute_for`: a layout's own basis (its micro-batches' 1-device runs)."""
    out = []
    for layout in layouts:
        p = predict(spec, layout, global_batch, hardware, compute_for(layout) if compute_for else compute, **how)
        out.append(Ranked(layout, p, p.memory_max, verdict(p.memory_max, available, error)))
    return out


# Those that fit are ranked first, then those that may not (the pick is one that fits, where one does).
FIT_ORDER = {"fits": 0, "not checked": 0, "may not fit": 1}


def rank(rows: list[Ranked], error: float | None) -> list[Ranked]:
    """Those that fit, fastest first (among equal steps, the leaner), then those that may not fit, each against the
    pick; those that do not fit follow, unranked."""
    fitting = sorted((r for r in rows if r.fit != "does not fit"),
                     key=lambda r: (FIT_ORDER[r.fit], r.step_s, r.memory, r.layout.name))
    dropped = sorted((r for r in rows if r.fit == "does not fit"), key=lambda r: (r.memory, r.layout.name))
    for i, r in enumerate(fitting, 1):   # fitting[0]: the pick
        r.rank = i
        r.separable = None if error is None else abs(r.step_s / fitting[0].step_s - 1) > error
        r.decides = decides(fitting[0], r)
    return fitting + dropped


def decides(pick: Ranked, other: Ranked) -> list[tuple[str, float]]:
    """The parts in which `other` spends more than the pick, largest first (seconds per step)."""
    more = [(part, other.parts[part] - pick.parts[part]) for part in PARTS]
    return sorted(((p, d) for p, d in more if d > 0), key=lambda pd: -pd[1])


def explain(row: Ranked, pick: Ranked, error: float | None, previous: Ranked | None = None) -> str:
    """One line: why this row stands where it does against the pick (and, where the model gives it the step of
    the row above, what tells the two apart)."""
    text = _against_pick(row, pick, error)
    if previous is not None and previous is not pick and row is not pick \
            and abs(row.step_s / previous.step_s - 1) <= SAME:
        text += f"; the same predicted step as {previous.layout.name}" + (
            f", {'more' if row.memory > previous.memory else 'less'} memory" if row.memory != previous.memory else "")
    return text


def _against_pick(row: Ranked, pick: Ranked, error: float | None) -> str:
    if row is pick:
        shares = ", ".join(f"{PARTS[p]} {s / row.step_s:.0%}" for p, s in row.parts.items()
                           if p != "overhead" and s / row.step_s >= 0.005)
        return f"the pick; its step: {shares}"
    gap = row.step_s / pick.step_s - 1
    if abs(gap) <= SAME:
        what = "the same predicted step as the pick"
        if row.memory != pick.memory:
            what += f", {'more' if row.memory > pick.memory else 'less'} memory"
        return what
    total = sum(d for _, d in row.decides)
    reasons = ", ".join(f"+{_ms(d)} ms {PARTS[p]}" for p, d in row.decides[:3] if d >= 0.05 * total)
    text = f"{gap:+.1%} against the pick: {reasons}" if reasons else f"{gap:+.1%} against the pick"
    if row.fit == "may not fit" and pick.fit != "may not fit":
        text = f"may not fit, ranked after those that fit; {text}"
    if error is not None and not row.separable:
        text += f"; within the ranking error ({error:.1%}): not separable from the pick"
    return text


def _ms(seconds: float) -> str:
    """Milliseconds to three significant digits, never in exponent notation (a large model's gap of 1.25 s is
    "1,250", not "1.25e+03")."""
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def row(r: Ranked, explanation: str, layers_per_stage: list[int] | None = None, auto_split: bool = False) -> dict:
    """`auto_split`: its stage split is the one --stage-split auto picks."""
    p = r.prediction
    return {"rank": r.rank, "layout": r.layout.name, "step_s": r.step_s, "samples_per_s": p.samples_per_s,
            **({"tokens_per_s_per_device": p.tokens_per_s / p.devices} if p.seq_len else {}),
            "memory_per_rank_max": r.memory, "memory_per_rank": p.memory_per_rank or p.model_per_rank,
            "fit": r.fit, "parts_s": r.parts, "separable": r.separable,
            "decides": [[part, s] for part, s in r.decides], "explanation": explanation, "auto_split": auto_split,
            **({"layers_per_stage": layers_per_stage} if layers_per_stage else {})}


def document(title: str, head: dict, rows: list[Ranked], space: Space, basis: str, available: float, limit: str,
             step_error: float | None, mem_error: float | None, top: int | None = None,
             split_of: Callable[[Layout], list[int] | None] = lambda _: None) -> dict:
    """The plan document bench.plan prints and writes: its rows (all, or the `top` ranked), each explained, and a
    summary of the space, the memory limit, the pick and how far the ranking can be trusted."""
    ranked = [r for r in rows if r.rank]
    pick = ranked[0] if ranked else None
    tied = [r.layout.name for r in ranked[1:] if r.separable is False or abs(r.step_s / pick.step_s - 1) <= SAME]
    reasons = sorted(space.refused.items(), key=lambda kv: -kv[1])
    refused = sum(space.refused.values())
    allowance = f", allowing the model's measured memory error {mem_error:.0%}" if mem_error else \
        " (no measured memory error: point predictions)"
    summary = [f"space: {len(space.valid) + refused:,} candidate layouts, {len(space.valid):,} valid; "
               f"{refused:,} refused" + (" (" + "; ".join(f"{n:,} x {why}" for why, n in reasons[:3])
                                          + ("; ..." if len(reasons) > 3 else "") + ")" if reasons else ""),
               f"memory: {limit}, {available / GIB:,.2f} GiB per device{allowance}: "
               f"{sum(1 for r in rows if r.fit == 'does not fit'):,} predicted not to fit (dropped), "
               f"{sum(1 for r in ranked if r.fit == 'may not fit'):,} may not fit (kept, flagged)"]
    if pick:
        p = pick.prediction
        rate = f"{p.tokens_per_s / p.devices:,.0f} tokens/s per device" if p.seq_len else \
            f"{p.samples_per_s:,.1f} samples/s"
        summary.append(f"pick: {pick.layout.name}, predicted {rate} ({pick.step_s * 1e3:,.0f} ms a step), "
                       f"{pick.memory / GIB:,.2f} GiB on its fullest rank")
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
    shown = rows if top is None else ranked[:top]
    return {"title": title, **head, "basis": basis, "available_bytes": available, "memory_limit": limit,
            "ranking_error": step_error, "memory_error": mem_error,
            "candidates": {"valid": len(space.valid), "fit": len(ranked), "refused": refused,
                           "reasons": space.refused},
            "pick": pick.layout.name if pick else None, "not_separable": tied, "summary": summary,
            "rows": [row(r, explain(r, pick, step_error, rows[i - 1] if i else None) if pick and r.rank else "",
                         split_of(r.layout), r.layout in space.auto) for i, r in enumerate(shown)]}
