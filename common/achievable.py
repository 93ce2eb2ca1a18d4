"""The achievable peak: the highest matmul FLOP/s a device reaches, measured, and the MFU against it.

A datasheet peak is what no kernel reaches, and a CPU has none the record could pin down (common.peak_flops);
stas00's mamf-finder (ml-engineering, compute/accelerator/benchmarks) measures instead: square products of a
few sizes at the run's precision, the device synchronised around each, the best of a few repeats. The probe
runs after the measured window and the evaluation (CONVENTIONS §2.8), on every rank at once, each on its own
device with its own threads, so that ranks sharing a core or a GPU share it as they did in training.

A framework offers it through its trainer's optional `time_matmul` (common.loop.Trainer); this module picks
the sizes, stops before the probe outgrows its budget, and turns the times into the record's
`achievable_peak` and `mfu_achievable`.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from statistics import mean

# Square sizes per device kind, smallest first. A CPU core runs a 1024^3 float32 product in about 30 ms (and a
# float16 one, emulated, in seconds: the budget stops it); a GPU needs thousands to fill its units.
SIZES = {"cpu": (256, 512, 1024), "cuda": (2048, 4096, 8192), "ascend": (2048, 4096, 8192)}
REPEATS = 5
# The probe's time on a rank at most (s), the untimed first product of each size included: a CPU's stays well
# under a second, as a run's tail should.
BUDGET_S = {"cpu": 0.5, "cuda": 2.0, "ascend": 2.0}

# (n, repeats) -> (math mode, the seconds of each timed n x n x n product on this rank's device): one untimed
# product first, the device synchronised around each timed one.
TimeMatmul = Callable[[int, int], "tuple[str, list[float]]"]


def timed_repeats(product: Callable[[], object], repeats: int, clock=time.perf_counter) -> list[float]:
    """Seconds of each of `repeats` calls of `product` after an untimed one (which allocates and compiles);
    `product` returns only once its device has finished (a synchronise, or a result read back)."""
    product()
    seconds = []
    for _ in range(repeats):
        t0 = clock()
        product()
        seconds.append(clock() - t0)
    return seconds


def matmul_flops(n: int) -> int:
    """An n x n x n product: n^3 multiply-adds, 2 FLOPs each."""
    return 2 * n ** 3


def probe(time_matmul: TimeMatmul, sizes: tuple[int, ...], repeats: int, budget_s: float,
          clock=time.perf_counter) -> dict:
    """Each size in turn while the next one's predicted time (the n^3 law from the last) fits the budget;
    {"flops_per_s", "precision", "shape", "tried": {n: FLOP/s}} of the best."""
    tried: dict[int, float] = {}
    precision, spent = "", 0.0
    for i, n in enumerate(sizes):
        t0 = clock()
        precision, seconds = time_matmul(n, repeats)
        spent += clock() - t0
        best_s = min(seconds)
        tried[n] = matmul_flops(n) / best_s if best_s > 0 else 0.0
        if i + 1 < len(sizes) and spent + (repeats + 1) * best_s * (sizes[i + 1] / n) ** 3 > budget_s:
            break
    best = max(tried, key=tried.get)
    return {"flops_per_s": tried[best], "precision": precision, "shape": [best, best, best],
            "tried": {str(n): f for n, f in tried.items()}}


def probe_rank(trainer, device_kind: str) -> dict | None:
    """This rank's probe through its trainer's `time_matmul`; None where the trainer has none or it fails
    (the figure is then null, the run goes on)."""
    time_matmul = getattr(trainer, "time_matmul", None)
    if time_matmul is None:
        return None
    try:
        return probe(time_matmul, SIZES.get(device_kind, SIZES["cuda"]), REPEATS,
                     BUDGET_S.get(device_kind, BUDGET_S["cuda"]))
    except Exception as exc:  # noqa: BLE001 - a probe the framework cannot run leaves the figure null
        print(f"rank {trainer.rank}: achievable-peak probe failed: {type(exc).__name__}: {exc}", flush=True)
        return None


def achievable_section(ranks: list[dict | None], device_kind: str, threads_per_device: int) -> dict | None:
    """The record's `achievable_peak` from each rank's probe; None where no rank measured one."""
    measured = [r for r in ranks if r]
    if not measured:
        return None
    first = measured[0]
    threads = f", {threads_per_device} thread(s) per device" if device_kind == "cpu" else ""
    method = (f"best of {REPEATS} square {first['precision']} matmuls per size (sizes {', '.join(first['tried'])} "
              f"of {', '.join(map(str, SIZES.get(device_kind, SIZES['cuda'])))}, stopping before the probe passes "
              f"{BUDGET_S.get(device_kind, BUDGET_S['cuda'])} s), device synchronised around each, every rank on "
              f"its own device at once, after the measured window{threads}; flops_per_s: the mean over ranks")
    return {"flops_per_s": mean(r["flops_per_s"] for r in measured), "precision": first["precision"],
            "method": method, "shape": first["shape"], "per_rank": [r["flops_per_s"] if r else None for r in ranks]}


def mfu_achievable(achieved_flops: float | None, devices: int, achievable: dict | None) -> float | None:
    """Achieved FLOP/s over devices x the achievable FLOP/s of one: null where either is unknown. Ranks that
    share a device measured their share of it, so devices x the mean share is the device's whole."""
    if not achieved_flops or not achievable or not achievable.get("flops_per_s"):
        return None
    return achieved_flops / (devices * achievable["flops_per_s"])
