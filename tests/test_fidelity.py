"""The replay-against-real comparison's statistics (gctestbed/analysis/fidelity.py), held against
an enumeration of every arrangement, the published Mann-Whitney tables, intervals worked by hand
and their coverage on samples of a known shift."""

from __future__ import annotations

import itertools
import math
import random
from math import comb

import pytest

from gctestbed.analysis import fidelity


def _k_by_enumeration(m: int, n: int, alpha: float = 0.05) -> int:
    """Every way of choosing which m of the m + n ranks are the first sample's: U counts the pairs
    in which the second sample's value is below the first's; the largest k with P(U <= k - 1) at most
    alpha / 2."""
    counts = [0] * (m * n + 1)
    for chosen in itertools.combinations(range(m + n), m):
        counts[sum(c - i for i, c in enumerate(chosen))] += 1      # others below each chosen rank
    total, k = comb(m + n, m), 0
    while sum(counts[:k + 1]) / total <= alpha / 2:
        k += 1
    return k


@pytest.mark.parametrize("m, n", [(2, 2), (3, 3), (3, 5), (4, 4), (4, 6), (5, 5), (6, 7)])
def test_the_critical_count_is_every_arrangements(m, n):
    assert fidelity.mann_whitney_k(m, n) == _k_by_enumeration(m, n)


def test_the_critical_count_is_the_published_tables():
    """Two-sided 5 % critical values of U (the largest U that rejects) are k - 1: 0 for 4 and 4, 2
    for 5 and 5, 17 for 9 and 9, 23 for 10 and 10; 3 and 3 have none (k = 0)."""
    assert [fidelity.mann_whitney_k(m, m) for m in (3, 4, 5, 9, 10)] == [0, 1, 3, 18, 24]


def test_the_shift_and_its_interval_worked_by_hand():
    """Four runs a side: k = 1, so the interval runs from the smallest replay/real ratio to the
    largest, and the estimate is the median of the 16 ratios."""
    real, replay = [1.0, 1.1, 1.2, 1.3], [1.05, 1.15, 1.25, 1.35]
    shift, lo, hi = fidelity.shift_interval(real, replay)
    assert lo == pytest.approx(1.05 / 1.3 - 1) and hi == pytest.approx(1.35 / 1.0 - 1)
    ratios = sorted(y / x for x in real for y in replay)
    assert shift == pytest.approx(math.sqrt(ratios[7] * ratios[8]) - 1)     # the median of logs: a geometric mean
    assert fidelity.shift_interval(real[:3], replay[:3])[1:] == (None, None)
    assert fidelity.verdict(lo, hi) == "cannot tell"
    assert fidelity.verdict(-0.05, 0.09) == "within" and fidelity.verdict(0.11, 0.3) == "over"
    assert fidelity.verdict(-0.3, -0.12) == "over" and fidelity.verdict(None, None).startswith("cannot tell")


def _exact_coverage(m: int, n: int, k: int) -> float:
    """1 - 2 P(U <= k - 1) under the null, by enumerating every arrangement (as _k_by_enumeration)."""
    counts = [0] * (m * n + 1)
    for chosen in itertools.combinations(range(m + n), m):
        counts[sum(c - i for i, c in enumerate(chosen))] += 1
    return 1 - 2 * sum(counts[:k]) / comb(m + n, m)


def test_the_interval_covers_a_known_shift_as_often_as_its_level_says():
    """Nine runs a side, log-normal step times, the replay 8 % slower: over 20,000 trials (a
    standard error of 0.14 points) the interval holds the true shift as often as the exact
    Mann-Whitney level for k = 18 says (96.0 %), within 0.4 points; the intervals of k = 17 or 19
    (96.9 %, 95.0 %) miss that (planted in shift_interval: either fails)."""
    exact = _exact_coverage(9, 9, 18)
    assert exact == pytest.approx(0.960, abs=0.001)
    rng = random.Random(3)
    hits, trials = 0, 20000
    for _ in range(trials):
        real = [math.exp(rng.gauss(0, 0.1)) for _ in range(9)]
        replay = [1.08 * math.exp(rng.gauss(0, 0.1)) for _ in range(9)]
        _, lo, hi = fidelity.shift_interval(real, replay)
        hits += lo <= 0.08 <= hi
    assert abs(hits / trials - exact) < 0.004, (hits / trials, exact)


def test_a_cell_and_a_summary_of_cells():
    real = [{"step_s": s, "wire": 1000} for s in (0.10, 0.12, 0.11)]
    replay = [{"step_s": s, "wire": 1010} for s in (0.121, 0.132, 0.143)]
    cell = fidelity.compare(real, replay)
    assert cell["error"] == pytest.approx(0.132 / 0.11 - 1) and cell["wire_diff"] == pytest.approx(0.01)
    assert cell["pairings"] == pytest.approx([0.121 / 0.12 - 1, 0.143 / 0.10 - 1])
    assert cell["real_spread"] == pytest.approx(0.2) and cell["replay_spread"] == pytest.approx(0.143 / 0.121 - 1)
    other = {**cell, "error": -0.03, "wire_diff": -0.02, "pairings": [-0.05, 0.01], "shift_interval": [-0.06, 0.02]}
    s = fidelity.summary([cell, other])
    assert s["median_abs_error"] == pytest.approx((0.2 + 0.03) / 2) and s["max_abs_error"] == pytest.approx(0.2)
    assert (s["cells_over_bound"], s["cells_whose_pairings_reach_past_bound"]) == (1, 1) and s["bound"] == 0.10
    wide = fidelity.summary([cell, other], bound=0.25)          # 0.2 and the pairings' 0.43 against 25 %
    assert (wide["bound"], wide["cells_over_bound"], wide["cells_whose_pairings_reach_past_bound"]) == (0.25, 0, 1)
    assert s["interval_verdicts"] == {"within": 1, "over": 0, "cannot tell": 1}
    assert s["max_abs_wire_diff"] == pytest.approx(0.02)
