"""How far a replay's step times are from independent real runs of the same cell.

Replays and real runs are independent samples (distinct seeds, other minutes of a noisy host), so
the comparison is of two samples, not of pairs: the replay's median against the real one's, the
range over every replay-against-real pairing, and the Hodges-Lehmann shift of the log step times
with its distribution-free 95 % interval (Hollander and Wolfe, Nonparametric Statistical Methods,
section 4.3), judged against a bound: within it, over it, or too wide to tell. The interval is
distribution-free where the two samples differ by a shift alone (spreads alike); where one side is
much noisier its coverage falls below 95 % (about 79 % for 3 noisy runs against 9 quiet ones), so
a "within" between samples of unequal spread is weaker than it reads. Used by
scripts/replay-fidelity, whose tables are docs/replay.md's fidelity section.
"""

from __future__ import annotations

import functools
import math
import statistics
from math import comb

BOUND = 0.10                        # issue 28: no cell over 10 %


@functools.lru_cache(maxsize=None)
def mann_whitney_k(m: int, n: int, alpha: float = 0.05) -> int:
    """The largest k with P(U <= k - 1) <= alpha / 2 under the null, U the Mann-Whitney count of an
    m-sample against an n-sample (exact, by counting arrangements): [d_(k), d_(mn+1-k)] of the
    sorted pairwise differences is then a distribution-free 1 - alpha interval for the shift. 0
    where no interval of that level exists (3 and 3)."""
    ways = [[[1] + [0] * (i * j) for j in range(n + 1)] for i in range(m + 1)]   # ways[i][j][u]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            ways[i][j] = [(ways[i - 1][j][u - j] if 0 <= u - j < len(ways[i - 1][j]) else 0)
                          + (ways[i][j - 1][u] if u < len(ways[i][j - 1]) else 0) for u in range(i * j + 1)]
    total, below, k = comb(m + n, m), 0, 0
    for u, w in enumerate(ways[m][n]):
        below += w
        if below / total > alpha / 2:
            return k
        k = u + 1
    return k


def shift_interval(real: list[float], replay: list[float]) -> tuple[float, float | None, float | None]:
    """The replay's step time against the real one's as a ratio - 1: the Hodges-Lehmann estimate
    (the median of every replay/real log ratio) and its 95 % interval (None, None where the samples
    are too small for one)."""
    d = sorted(math.log(y) - math.log(x) for x in real for y in replay)
    k = mann_whitney_k(len(real), len(replay))
    if k < 1:
        return math.exp(statistics.median(d)) - 1, None, None
    return math.exp(statistics.median(d)) - 1, math.exp(d[k - 1]) - 1, math.exp(d[len(d) - k]) - 1


def verdict(lo: float | None, hi: float | None, bound: float = BOUND) -> str:
    """Whether an interval of the shift says the replay is within ``bound`` of the real runs, past
    it, or cannot tell."""
    if lo is None:
        return "cannot tell (too few runs for a 95 % interval)"
    if -bound < lo and hi < bound:
        return "within"
    if lo > bound or hi < -bound:
        return "over"
    return "cannot tell"


def compare(real: list[dict], replay: list[dict]) -> dict:
    """One cell's replays (each a run's ``step_s`` and ``wire`` bytes a step) against its real runs:
    the medians, the replay median's error, the range over every pairing, the shift and its
    interval, each side's spread (max / min - 1) and the wire bytes' difference of the medians."""
    rs, ps = [r["step_s"] for r in real], [r["step_s"] for r in replay]
    mr, mp = statistics.median(rs), statistics.median(ps)
    pairs = [y / x - 1 for y in ps for x in rs]
    wr, wp = statistics.median(r["wire"] for r in real), statistics.median(r["wire"] for r in replay)
    shift, lo, hi = shift_interval(rs, ps)
    return {"real_median_s": mr, "replay_median_s": mp, "error": mp / mr - 1, "pairings": [min(pairs), max(pairs)],
            "shift": shift, "shift_interval": [lo, hi], "real_spread": max(rs) / min(rs) - 1,
            "replay_spread": max(ps) / min(ps) - 1, "wire_real": wr, "wire_replay": wp, "wire_diff": wp / wr - 1}


def summary(cells: list[dict], bound: float = BOUND) -> dict:
    """Over cells each holding ``compare``'s figures: the median and largest |error|, the cells
    over ``bound``, those whose pairings reach past it, the interval verdicts, the largest wire
    difference."""
    errs = [abs(c["error"]) for c in cells]
    return {"cells": len(cells), "bound": bound, "median_abs_error": statistics.median(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None, "cells_over_bound": sum(e > bound for e in errs),
            "cells_whose_pairings_reach_past_bound": sum(max(abs(x) for x in c["pairings"]) > bound for c in cells),
            "interval_verdicts": {v: sum(verdict(*c["shift_interval"], bound).startswith(v) for c in cells)
                                  for v in ("within", "over", "cannot tell")},
            "max_abs_wire_diff": max((abs(c["wire_diff"]) for c in cells), default=None)}
