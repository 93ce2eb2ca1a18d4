"""The intervals a sweep with repeats reports, on fixed numbers."""
from __future__ import annotations

import numpy as np
import pytest

from common.stats import (
    Interval,
    interval_of,
    point_throughput,
    ratio_interval,
    spearman,
    throughput_draws,
    throughput_interval,
    verdict,
)


def _runs(speeds: list[float], steps: int = 20, noise: float = 0.02, seed: int = 0) -> list[list[float]]:
    """Per-step times of runs whose mean step is 1/speed (32 samples a step), with step-to-step noise."""
    rng = np.random.default_rng(seed)
    return [list(32 / s * np.exp(rng.normal(0, noise, steps))) for s in speeds]


def test_runs_without_spread_give_an_interval_of_one_point():
    runs = [[0.5] * 10, [0.5] * 10, [0.5] * 10]
    assert throughput_interval(runs, 32) == Interval(64.0, 64.0, 64.0)


def test_the_point_is_the_median_run_and_one_disturbed_run_moves_it_least():
    runs = [[0.5] * 5, [0.4] * 5, [2.0] * 5]  # 64, 80 and a run on a busy machine at 16 samples/s
    assert point_throughput(runs, 32) == pytest.approx(64.0)


def test_the_interval_holds_the_spread_between_runs_not_only_within_them():
    steady = throughput_interval(_runs([100, 100, 100]), 32)
    drifting = throughput_interval(_runs([90, 100, 110]), 32)
    assert steady.low <= steady.value <= steady.high
    assert drifting.high - drifting.low > 3 * (steady.high - steady.low)
    assert drifting.low <= 100 <= drifting.high


def test_the_same_seed_gives_the_same_interval():
    runs = _runs([95, 100, 104])
    assert throughput_interval(runs, 32, seed=3) == throughput_interval(runs, 32, seed=3)


def test_efficiency_carries_the_noise_of_both_rows():
    """Two rows as noisy as each other (3 runs, 8% apart): the efficiency's interval spans the rows' own
    intervals at their extremes (fast N over slow 1, slow N over fast 1), which the noise of either row alone
    (the other made steady) does not, by far."""
    one, two = _runs([92, 100, 108], seed=1), _runs([184, 200, 216], seed=2)
    eff = ratio_interval((two, 32), (one, 32), scale=1 / 2)
    assert eff.value == pytest.approx(point_throughput(two, 32) / (2 * point_throughput(one, 32)))
    at_one, at_two = throughput_interval(one, 32), throughput_interval(two, 32)
    assert eff.low == pytest.approx(at_two.low / at_one.high / 2, abs=0.02)    # 0.85 here
    assert eff.high == pytest.approx(at_two.high / at_one.low / 2, abs=0.02)   # 1.17 here

    def steady(runs):  # the same row without noise: every step at the row's point figure
        return [[32 / point_throughput(runs, 32)] * len(r) for r in runs]
    for alone in (ratio_interval((two, 32), (steady(one), 32), 1 / 2),
                  ratio_interval((steady(two), 32), (one, 32), 1 / 2)):
        assert eff.high - eff.low > 1.5 * (alone.high - alone.low)


def test_only_a_difference_beyond_the_noise_is_ranked():
    before = _runs([100, 102, 98], seed=4)
    assert verdict(ratio_interval((_runs([70, 71, 69], seed=5), 32), (before, 32))) == "slower"
    assert verdict(ratio_interval((_runs([130, 128, 131], seed=6), 32), (before, 32))) == "faster"
    assert verdict(ratio_interval((_runs([99, 103, 100], seed=7), 32), (before, 32))) == "no difference"
    # A threshold: 5% slower is within a 10% allowance.
    assert verdict(ratio_interval((_runs([95, 95, 95], noise=0.001, seed=8), 32),
                                  (_runs([100, 100, 100], noise=0.001, seed=9), 32)), threshold=0.10) == "no difference"


def test_overlapping_intervals_are_no_difference():
    assert Interval(10, 9, 11).overlaps(Interval(11.5, 10.5, 12))
    assert not Interval(10, 9, 10.4).overlaps(Interval(11.5, 10.5, 12))


def test_the_bootstrap_s_pieces_by_hand():
    assert Interval(1, 0, 2).as_record() == {"value": 1, "low": 0, "high": 2, "confidence": 0.95}
    assert Interval(1, 0, 2).overlaps(Interval(3, 2, 4)) and Interval(3, 2, 4).overlaps(Interval(1, 0, 2))
    assert not Interval(1, 0, 2).overlaps(Interval(3, 2.01, 4))
    # the 2.5th and 97.5th percentiles of the draws around the point, whatever the point
    got = interval_of(7.0, np.arange(1001.0))
    assert (got.value, got.low, got.high) == (7.0, pytest.approx(25.0), pytest.approx(975.0))
    # empty runs count for nothing; none at all is an error
    assert point_throughput([[0.5, 0.5], [], [0.25]], 32) == pytest.approx(96.0)  # median of 64 and 128
    with pytest.raises(ValueError, match="no run has measured step times"):
        throughput_draws([[], []], 32)
    draws = throughput_draws([[0.5, 0.5], [], [0.25, 0.25]], 32, draws=500, seed=1)
    assert draws.shape == (500,) and set(np.round(draws, 9)) <= {64.0, 96.0, 128.0}
    assert {64.0, 96.0, 128.0} <= set(np.round(draws, 9))  # both runs drawn alone and together
    assert np.array_equal(draws, throughput_draws([[0.5, 0.5], [0.25, 0.25]], 32, draws=500, seed=1))
    assert not np.array_equal(draws, throughput_draws([[0.5, 0.5], [0.25, 0.25]], 32, draws=500, seed=2))
    # within a run, its step times resampled: the mean of a draw lies between the run's fastest and slowest step
    one_run = throughput_draws([[1.0, 2.0, 4.0]], 4, draws=300)
    assert one_run.min() >= 1.0 - 1e-9 and one_run.max() <= 4.0 + 1e-9 and len(set(one_run)) > 3
    assert throughput_interval([[1.0, 2.0, 4.0]], 4).value == pytest.approx(4 / (7 / 3))


def test_a_verdict_at_its_threshold():
    assert verdict(Interval(0.9, 0.85, 0.95)) == "slower" and verdict(Interval(0.9, 0.85, 1.0)) == "no difference"
    assert verdict(Interval(1.1, 1.05, 1.2)) == "faster" and verdict(Interval(1.1, 1.0, 1.2)) == "no difference"
    assert verdict(Interval(0.9, 0.85, 0.9), threshold=0.1) == "no difference"
    assert verdict(Interval(0.9, 0.85, 0.89), threshold=0.1) == "slower"
    assert verdict(Interval(1.2, 1.1, 1.3), threshold=0.1) == "no difference"
    assert verdict(Interval(1.2, 1.11, 1.3), threshold=0.1) == "faster"
    scaled = ratio_interval(([[1.0] * 5], 8), ([[1.0] * 5], 4), scale=0.25)
    assert scaled == Interval(0.5, 0.5, 0.5)


def test_the_seeds_are_fixed_and_every_step_can_be_drawn():
    """The same numbers from one call to the next (seed 0 by default, the denominator's stream one above the
    numerator's), and a resample can draw any step of a run, the first too."""
    runs, other = _runs([95, 100, 104]), _runs([60, 62, 58], seed=5)
    assert throughput_interval(runs, 32) == throughput_interval(runs, 32, seed=0) != \
        throughput_interval(runs, 32, seed=3)
    assert ratio_interval((runs, 32), (other, 32)) == ratio_interval((runs, 32), (other, 32), seed=0)
    top, bottom = throughput_draws(runs, 32, seed=4), throughput_draws(other, 32, seed=5)
    assert ratio_interval((runs, 32), (other, 32), seed=4) == interval_of(
        point_throughput(runs, 32) / point_throughput(other, 32), top / bottom)
    assert np.array_equal(throughput_draws(runs, 32), throughput_draws(runs, 32, seed=0))
    assert throughput_draws([[1.0, 3.0]], 4, draws=300).max() == pytest.approx(4.0)  # both draws of step 0
    with pytest.raises(ValueError, match="^no run has measured step times$"):
        throughput_draws([], 32)


def test_spearman_by_hand():
    """Pearson's correlation of the ranks: [1, 2, 3] against [1, 3, 2] has rank deviations (-1, 0, 1) and (-1, 1, 0),
    covariance 1 over variances 2: 0.5. Tied values share their average rank: [1, 1, 2, 3] ranks 1.5, 1.5, 3, 4,
    deviations (-1, -1, 0.5, 1.5) against (-1.5, -0.5, 0.5, 1.5): 4.5 / sqrt(4.5 x 5) = 3 / sqrt(10)."""
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([10, 20, 30], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / 10 ** 0.5)
    # two distinct ranks a side are enough: (-0.5, -0.5, 1) against (-1, 0.5, 0.5), 0.75 over variances 1.5
    assert spearman([1, 1, 2], [1, 2, 2]) == pytest.approx(0.5)
    # fewer than three pairs, pairs that do not match up, or either side constant: no figure
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 2, 3], [1, 2]) is None
    assert spearman([4, 4, 4], [1, 2, 3]) is None and spearman([1, 2, 3], [4, 4, 4]) is None
