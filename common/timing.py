"""Step timing statistics, aggregated over ranks the way CONVENTIONS §2.3 asks."""
from __future__ import annotations

import numpy as np

MAX_SAMPLES = 1000  # per-step times kept in a record, evenly strided beyond this


def summarize(values) -> dict[str, float] | None:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return None
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "min": float(a.min()), "max": float(a.max()), "std": float(a.std())}


def aggregate_ranks(per_rank: list[dict]) -> dict:
    """Combine the measured windows of all ranks.

    A step is as slow as its slowest rank, so the step time of step i is the max over ranks;
    throughput divides all samples processed by the longest measured window of any rank.
    """
    steps = [np.asarray(r["step_times"], dtype=np.float64) for r in per_rank]
    n = min(len(s) for s in steps)
    slowest = np.max(np.stack([s[:n] for s in steps]), axis=0) if n else np.zeros(0)
    window = max(float(r["measured_time"]) for r in per_rank)
    wait = [float(np.sum(r["data_wait"])) / max(float(r["measured_time"]), 1e-12) for r in per_rank]
    stride = max(1, -(-n // MAX_SAMPLES))
    return {
        "measured_steps": int(n),
        "step_time_s": summarize(slowest),
        "step_times_s": slowest[::stride].round(6).tolist(),  # for distributions in reports
        "measured_time_s": window,
        "data_wait_fraction": float(np.mean(wait)) if n else None,
    }
