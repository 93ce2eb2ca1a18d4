"""The validation table of common.predict.validation's results: bench.predict --validate prints it, bench.report
shows it when RESULTS/validation.json exists, and every prediction table quotes its summary."""
from __future__ import annotations

import json
from pathlib import Path

from bench.reporting.document import Block, Heading, Table, Text
from bench.reporting.tables import fmt_share
from common.predict.basis import MEASURE_THE_SPLIT

FILE = "validation.json"
COLUMNS = ["backend", "layout", "N", "step predicted (ms)", "step measured (ms)", "step error",
           "error ignoring load", "memory/rank error", "training memory/rank error", "state bytes exact",
           "idle per stage predicted", "idle per stage measured", "comm bytes as counted", "notes"]


def load(results: Path) -> dict | None:
    try:
        return json.loads((Path(results) / FILE).read_text())
    except (OSError, ValueError):  # none, or unreadable
        return None


def _signed(value) -> str:
    return "" if value is None else f"{value:+.1%}"


def _comm(check: dict | None) -> str:
    if not check:
        return ""
    wrong = [f"{k}: {v['predicted']} vs {v['measured']}" for k, v in check.items() if v["predicted"] != v["measured"]]
    return "; ".join(wrong) or "yes"


def rows(validation: dict) -> list[list[str]]:
    body = []
    for r in validation["runs"]:
        step, idle = r["step_s"], r.get("idle_per_stage") or {}
        guessed = ["GUESSED basis: " + "; ".join(r["basis_guesses"])] if r.get("basis_guesses") else []
        notes = (["oversubscribed"] if r["oversubscribed"] else []) + guessed + list(r.get("notes") or [])
        body.append([r["backend"], r["layout"], str(r["devices"]), f"{step['predicted'] * 1e3:,.0f}",
                     f"{step['measured'] * 1e3:,.0f}", _signed(step["error"]),
                     _signed(step.get("error_ignoring_load")), _signed(r["memory_per_rank"]["error"]),
                     _signed((r.get("training_memory_per_rank") or {}).get("error")),
                     {None: "", True: "yes", False: "NO"}[r["state_bytes_per_rank"]["exact"]],
                     *(", ".join(map(fmt_share, idle.get(k) or [])) for k in ("predicted", "measured")),
                     _comm(r.get("comm_per_step")), "; ".join(notes)])
    return body


CONFIG_COLUMNS = ["backend", "layout", "N", "runs", "step predicted (ms)", "step measured (ms)",
                  "measured range (ms)", "step error"]


def repeated(validation: dict) -> bool:
    """Whether some configuration ran more than once (bench.compare --repeats): then its median is the figure."""
    return ((validation["summary"].get("configurations") or {}).get("all") or {}).get("most_repeats", 0) > 1


def config_rows(validation: dict) -> list[list[str]]:
    body = []
    for c in validation.get("configurations") or []:
        step = c["step_s"]
        low, high = step["measured_range"]
        body.append([c["backend"], c["layout"] + (" (oversubscribed)" if c["oversubscribed"] else ""),
                     str(c["devices"]), str(len(c["runs"])), f"{step['predicted'] * 1e3:,.0f}",
                     f"{step['measured'] * 1e3:,.0f}", f"{low * 1e3:,.0f}-{high * 1e3:,.0f}", _signed(step["error"])])
    return body


def _spread(errors: dict) -> str:
    return f"{errors['median_abs_error']:.1%}, largest {errors['max_abs_error']:.1%}"


def summary_line(validation: dict, source: str) -> str:
    """One sentence: the error a prediction rests on (of the configurations' medians where runs were repeated)."""
    summary = validation["summary"]
    s, step = summary["all"], summary["all"]["step_s"]
    if not step["runs"]:
        return f"Validation ({source}): no run could be predicted."
    text = f"Validation ({source}, hardware {validation['hardware']}): step time median |error| "
    if repeated(validation):
        configs = summary["configurations"]["all"]
        text += (f"{_spread(configs['step_s'])} over {configs['step_s']['runs']} configurations (the median of up "
                 f"to {configs['most_repeats']} repeats each; run by run {_spread(step)} over {step['runs']} runs)")
    else:
        text += f"{_spread(step)} over {step['runs']} runs"
    for part, what in (("memory_per_rank", "memory per rank"), ("training_memory_per_rank", "training memory")):
        if (s.get(part) or {}).get("runs"):
            text += f"; {what} median {_spread(s[part])}"
    text += f"; state bytes exact in {s['state_bytes_exact']} of {s['state_bytes_compared']}"
    if over := summary["oversubscribed_runs"]:
        text += f"; {over} run(s) oversubscribed, predicted as such"
    if skipped := summary["skipped_runs"]:
        text += f"; {skipped} run(s) left out (see {FILE})"
    if guessed := s.get("resting_on_a_guess"):
        text += (f". {guessed} of {step['runs']} predictions rest on a GUESSED split of their 1-device step; "
                 + MEASURE_THE_SPLIT)
    return text + "."


def validation_blocks(results: Path) -> list[Block]:
    validation = load(results)
    if not validation:
        return []
    return [Heading("Prediction against measurement", 2),
            Text("Every multi-device run predicted by `bench.predict --validate` from this folder's 1-device runs "
                 "and link probes only (docs/prediction.md). Errors are (predicted - measured) / measured "
                 "of the median step and of each rank's peak memory (the worst rank); training memory is the growth "
                 "over the start where a record measured it (record[\"memory\"]). " +
                 summary_line(validation, FILE)),
            *([Text("Each configuration's repeats as one: the median of their predictions against the median of "
                    "their measured steps."), Table(CONFIG_COLUMNS, config_rows(validation))]
              if repeated(validation) else []),
            Table(COLUMNS, rows(validation))]
