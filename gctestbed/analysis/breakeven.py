"""Speedup over a baseline at each bandwidth, and the bandwidth where it crosses 1.

The baseline is ``none`` (plain fp32 DDP) unless asked otherwise: HotNets 2024 argued that fp16
or bf16 is what practitioners already run, so ``--baseline fp16`` measures what compression adds
to that. Within a group (same workload, nodes, latency, batch size, mode, optimizer), a method's
speedup at a bandwidth is the baseline's median step time over the method's. The break-even bandwidth is where the
speedup falls through 1 as bandwidth rises, interpolated linearly in log-bandwidth between the two
measured bandwidths around it. With repeats, two more curves bound it: the least favourable
speedup (none's fastest repeat over the method's slowest) and the most favourable; where each
crosses 1 gives the interval.
Alongside speed, convergence: a method that is faster but ends at a clearly higher loss than
``none`` (or never reaches none's loss in the time none took) is flagged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .cells import GROUP, Row

BASELINE = "none"
BASELINES = ("none", "fp16", "bf16")
WORSE_LOSS = 1.05        # a final loss more than 5 % above none's counts as converging worse


@dataclass
class Point:
    bw_bps: int
    speedup: float
    low: float              # none's fastest repeat over the method's slowest
    high: float             # none's slowest over the method's fastest
    method_s: float
    none_s: float
    repeats: int


@dataclass
class Crossing:
    kind: str               # "crosses" | "always" (pays off at every bandwidth measured) | "never" | "above" (pays off only above)
    bw_bps: float | None = None
    low_bps: float | None = None
    high_bps: float | None = None

    def text(self, fmt) -> str:
        if self.kind == "always":
            return f"pays off at every bandwidth measured (break-even above {fmt(self.high_bps)})"
        if self.kind == "never":
            return f"never pays off in the range measured (break-even below {fmt(self.low_bps)})"
        span = f" [{fmt(self.low_bps)} .. {fmt(self.high_bps)}]" if self.low_bps != self.high_bps else ""
        if self.kind == "above":
            return f"pays off only above {fmt(self.bw_bps)}{span}"
        return f"{fmt(self.bw_bps)}{span}"


@dataclass
class Curve:
    group: tuple
    compressor: str
    points: list[Point]
    crossing: Crossing
    flags: list[str] = field(default_factory=list)


def _by(rows: list[Row], *keys: str) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = {}
    for r in rows:
        out.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    return out


def crossing(bws: list[float], speedups: list[float]) -> tuple[str, float | None]:
    """Where ``speedups`` (at ascending ``bws``) first falls through 1, in log-bandwidth."""
    for i in range(len(bws) - 1):
        s0, s1 = speedups[i], speedups[i + 1]
        if s0 >= 1 > s1:
            x0, x1 = math.log(bws[i]), math.log(bws[i + 1])
            return "crosses", math.exp(x0 + (s0 - 1) / (s0 - s1) * (x1 - x0))
    if all(s >= 1 for s in speedups):
        return "always", None
    if all(s < 1 for s in speedups):
        return "never", None
    for i in range(len(bws) - 1):       # only rising through 1: pays off above
        s0, s1 = speedups[i], speedups[i + 1]
        if s0 < 1 <= s1:
            x0, x1 = math.log(bws[i]), math.log(bws[i + 1])
            return "above", math.exp(x0 + (1 - s0) / (s1 - s0) * (x1 - x0))
    return "never", None


def _crossing(points: list[Point]) -> Crossing:
    bws = [p.bw_bps for p in points]
    kind, bw = crossing(bws, [p.speedup for p in points])
    if kind in ("always", "never"):
        return Crossing(kind, None, low_bps=min(bws), high_bps=max(bws))
    ends = [crossing(bws, [getattr(p, side) for p in points])[1] for side in ("low", "high")]
    ends = [e for e in ends if e is not None] + [bw]
    return Crossing(kind, bw, low_bps=min(ends), high_bps=max(ends))


def curves(rows: list[Row], baseline: str = BASELINE) -> list[Curve]:
    """Every method's speedup curve and break-even in every group that has ``baseline``."""
    out = []
    for group, members in _by(rows, *GROUP).items():
        by_method = _by(members, "compressor")
        base = {bw: [r.step_s for r in rs] for (bw,), rs in _by(by_method.get((baseline,), []), "bw_bps").items()}
        if not base:
            continue
        for (label,), rs in sorted(by_method.items()):
            if label == baseline:
                continue
            points = []
            for (bw,), cell in sorted(_by(rs, "bw_bps").items()):
                if bw not in base:
                    continue
                t, n = [r.step_s for r in cell], base[bw]
                points.append(Point(bw, statistics.median(n) / statistics.median(t), min(n) / max(t), max(n) / min(t),
                                    statistics.median(t), statistics.median(n), len(t)))
            if points:
                curve = Curve(group, label, points, _crossing(points))
                curve.flags = _convergence_flags(curve, cell_rows=rs, base_rows=by_method[(baseline,)], baseline=baseline)
                out.append(curve)
    return out


def time_to_target(row: Row, target: float) -> float | None:
    """Wall time until rank 0's loss first reaches ``target`` (None: never)."""
    return next((t for t, loss in zip(row.wall, row.losses) if loss is not None and loss <= target), None)


def _convergence_flags(curve: Curve, cell_rows: list[Row], base_rows: list[Row], baseline: str = BASELINE) -> list[str]:
    """Bandwidths where the method is faster per step but converged worse than the baseline."""
    flags = []
    base = {r.bw_bps: r for r in base_rows}
    for r in cell_rows:
        b = base.get(r.bw_bps)
        point = next((p for p in curve.points if p.bw_bps == r.bw_bps), None)
        if b is None or point is None or point.speedup <= 1 or r.final_loss is None or b.final_loss is None:
            continue
        if r.final_loss > b.final_loss * WORSE_LOSS:
            reach = time_to_target(r, b.final_loss * WORSE_LOSS)
            flags.append(f"at {r.bw_bps / 1e6:g} Mbit/s it is {point.speedup:.2f}x faster per step but ends at loss "
                         f"{r.final_loss:.4g} against {baseline}'s {b.final_loss:.4g}; time to {baseline}'s loss (x1.05): "
                         f"{'never in this run' if reach is None else f'{reach:.3g} s against {b.wall[-1]:.3g} s'}")
    return sorted(set(flags))


def best_per_bandwidth(rows: list[Row]) -> dict[tuple, list[tuple[int, str, float]]]:
    """Per group: at each bandwidth the method with the lowest median step time."""
    out: dict[tuple, list] = {}
    for group, members in _by(rows, *GROUP).items():
        best = []
        for (bw,), cell in sorted(_by(members, "bw_bps").items()):
            times = {label: statistics.median(r.step_s for r in rs) for (label,), rs in _by(cell, "compressor").items()}
            winner = min(times, key=times.get)
            best.append((bw, winner, times[winner]))
        out[group] = best
    return out
