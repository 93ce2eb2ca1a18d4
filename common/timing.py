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
    throughput divides all samples processed by the longest measured window of any rank. A step in
    which any rank compiled (`compiled_steps`: positions in `step_times`) is compile time, not
    throughput (CONVENTIONS 2.3): it leaves every rank's window.
    """
    compiled = sorted({i for r in per_rank for i in r.get("compiled_steps", ())})
    steps = [np.delete(np.asarray(r["step_times"], dtype=np.float64), compiled) for r in per_rank]
    waits = [np.delete(np.asarray(r["data_wait"], dtype=np.float64), compiled) for r in per_rank]
    n = min(len(s) for s in steps)
    slowest = np.max(np.stack([s[:n] for s in steps]), axis=0) if n else np.zeros(0)
    windows = [float(np.sum(s)) for s in steps]
    window = max(windows)
    wait = [float(np.sum(w)) / max(t, 1e-12) for w, t in zip(waits, windows)]
    stride = max(1, -(-n // MAX_SAMPLES))
    return {
        "measured_steps": int(n),
        "step_time_s": summarize(slowest),
        "step_times_s": slowest[::stride].round(6).tolist(),  # for distributions in reports
        "measured_time_s": window,
        "data_wait_fraction": float(np.mean(wait)) if n else None,
    }
