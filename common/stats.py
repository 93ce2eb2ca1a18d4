"""Intervals for throughput measured over repeated runs, and the comparisons made with them.

A row of a sweep run R times gives R runs, each with its own measured step times. Two sources of
noise are in them: step to step within a run, and run to run (the machine drifts: the same bare
loop ran 54 and 89 samples/s twenty minutes apart here). The second dominates, and R is small, so
the interval comes from a two-level (hierarchical) bootstrap: resample the runs with replacement,
then within each drawn run its step times with replacement, and recompute the row's figure. That
keeps the between-run spread, which a bootstrap over pooled step times would hide, and still uses
each run's own spread, which a bootstrap over R run medians (R = 3: ten distinct draws) would not.
The row's figure is the median over its runs of samples/s (one disturbed run moves it least).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
DRAWS = 2000
Row = tuple[Sequence[Sequence[float]], float]  # (each run's measured step times, samples per step)


@dataclass(frozen=True)
class Interval:
    value: float   # the point estimate
    low: float
    high: float

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def as_record(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "confidence": CONFIDENCE}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def throughput_draws(runs: Sequence[Sequence[float]], samples_per_step: float, draws: int = DRAWS,
                     seed: int = 0) -> np.ndarray:
    """Bootstrap draws of the row's samples/s: median over resampled runs of samples / mean resampled step."""
    times = [np.asarray(r, dtype=np.float64) for r in runs if len(r)]
    if not times:
        raise ValueError("no run has measured step times")
    rng = _rng(seed)
    count = len(times)
    # means[slot, run, draw]: an independent step resample of `run` for each slot of each draw.
    means = np.stack([np.stack([t[rng.integers(0, len(t), (draws, len(t)))].mean(axis=1) for t in times])
                      for _ in range(count)])
    picked = rng.integers(0, count, (count, draws))  # which run fills each slot of each draw
    rates = samples_per_step / means[np.arange(count)[:, None], picked, np.arange(draws)[None, :]]
    return np.median(rates, axis=0)


def point_throughput(runs: Sequence[Sequence[float]], samples_per_step: float) -> float:
    return float(np.median([samples_per_step / np.mean(r) for r in runs if len(r)]))


def interval_of(value: float, draws: np.ndarray) -> Interval:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(value), float(low), float(high))


def throughput_interval(runs: Sequence[Sequence[float]], samples_per_step: float, seed: int = 0) -> Interval:
    return interval_of(point_throughput(runs, samples_per_step), throughput_draws(runs, samples_per_step, seed=seed))


def ratio_interval(numerator: Row, denominator: Row, scale: float = 1.0, seed: int = 0) -> Interval:
    """scale x throughput(numerator) / throughput(denominator), each row (runs, samples per step) bootstrapped
    on its own and the ratio taken draw by draw: the interval carries the noise of both rows. Scaling
    efficiency is (row at N, row at 1) with scale 1/N; a before/after comparison is (after, before)."""
    top, bottom = throughput_draws(*numerator, seed=seed), throughput_draws(*denominator, seed=seed + 1)
    value = scale * point_throughput(*numerator) / point_throughput(*denominator)
    return interval_of(value, scale * top / bottom)


def verdict(ratio: Interval, threshold: float = 0.0) -> str:
    """'slower' or 'faster' when the whole interval of after/before lies beyond 1 -/+ threshold, else
    'no difference': a difference inside the noise is not ranked."""
    if ratio.high < 1 - threshold:
        return "slower"
    if ratio.low > 1 + threshold:
        return "faster"
    return "no difference"


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks; None for fewer than three pairs or a constant."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = pd.Series(x).rank(method="average"), pd.Series(y).rank(method="average")
    if rx.nunique() < 2 or ry.nunique() < 2:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
