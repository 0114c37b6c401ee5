"""From a measurement to a verdict: ``agree``, ``disagree`` or ``inconclusive``.

A claim is judged in parts. Each part measures one figure with an interval (from repeats, or
where there is one run from the noise inside it: the spread of its step times, the binomial error
of an accuracy on a finite held-out set) and states the region where the claim holds. The whole
interval inside the region: agree. The interval clear of it: disagree. Straddling its edge, or not
measured: inconclusive, because the noise could flip it. A part measured outside the conditions
its source spoke of (claims.conditions) is not judged at all: ``out of scope here``, with the
reasons. A claim agrees when every part agrees, disagrees when any part judged disagrees, is out
of scope when a part is and none disagrees, and is inconclusive otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

AGREE, DISAGREE, INCONCLUSIVE, OUT_OF_SCOPE = "agree", "disagree", "inconclusive", "out of scope here"


@dataclass
class Measure:
    """A figure and its interval [low, high]; ``value`` None: could not be measured (``why`` says)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    why: str = ""
    detail: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.value is not None:
            self.low = self.value if self.low is None else self.low
            self.high = self.value if self.high is None else self.high

    @classmethod
    def missing(cls, why: str) -> "Measure":
        return cls(None, why=why)


@dataclass(frozen=True)
class Region:
    """Where a figure must lie for the claim to hold: [low, high], either end open (None)."""

    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"between {self.low:g} and {self.high:g}"
        return f"at least {self.low:g}" if self.low is not None else f"at most {self.high:g}"

    def disagree_text(self) -> str:
        """What result would have disagreed: a whole interval clear of the region."""
        if self.low is not None and self.high is not None:
            return f"a whole interval below {self.low:g} or above {self.high:g}"
        return f"a whole interval below {self.low:g}" if self.low is not None else f"a whole interval above {self.high:g}"

    def judge(self, m: Measure) -> str:
        if m.value is None or not all(map(math.isfinite, (m.low, m.high))):
            return INCONCLUSIVE
        lo = -math.inf if self.low is None else self.low
        hi = math.inf if self.high is None else self.high
        if lo <= m.low and m.high <= hi:
            return AGREE
        if m.high < lo or m.low > hi:
            return DISAGREE
        return INCONCLUSIVE


def at_least(x: float) -> Region:
    return Region(low=x)


def at_most(x: float) -> Region:
    return Region(high=x)


def between(a: float, b: float) -> Region:
    return Region(a, b)


def combine(verdicts: list[str]) -> str:
    """Every part agrees: agree; any judged part disagrees: disagree; else any part out of scope:
    out of scope here; else inconclusive."""
    if verdicts and all(v == AGREE for v in verdicts):
        return AGREE
    if any(v == DISAGREE for v in verdicts):
        return DISAGREE
    if any(v == OUT_OF_SCOPE for v in verdicts):
        return OUT_OF_SCOPE
    return INCONCLUSIVE
