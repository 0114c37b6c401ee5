"""Time to accuracy: steps and seconds of training until the held-out accuracy (or loss) reaches a
target, per method and bandwidth, next to the baseline's.

Step time alone flatters a method that learns less per step; only time to the same accuracy says
whether it finished sooner (HotNets 2024). The target is what the user asks for, or else 99 % of
the baseline's final held-out accuracy in that group (its median over cells). Accuracy is read
from the evaluations ``--eval-every`` stores, so the resolution is that many steps.
"""

from __future__ import annotations

import dataclasses
import statistics

from .breakeven import Crossing, crossing
from .cells import Row, group_label, time_to

OF_BASELINE = 0.99


def table(rows: list[Row], baseline: str = "none", accuracy: float | None = None,
          loss: float | None = None) -> list[dict]:
    """One entry per group with its target and, per (method, bandwidth), steps and seconds to it."""
    out = []
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    for group, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        base = [r for r in members if r.compressor == baseline]
        target_acc, target_loss = accuracy, loss
        if target_acc is None and target_loss is None:
            finals = [r.eval_accuracy for r in base if r.eval_accuracy is not None]
            if not finals:
                continue
            target_acc = OF_BASELINE * statistics.median(finals)
        entries = []
        for r in sorted(members, key=lambda r: (r.compressor != baseline, r.compressor, r.bw_bps)):
            reached = time_to(r, target_acc, target_loss)
            entries.append({"compressor": r.compressor, "bw_bps": r.bw_bps, "run_id": r.run_id,
                            "steps": reached[0] if reached else None, "seconds": reached[1] if reached else None,
                            "evaluations": len(r.evals), "final_accuracy": r.eval_accuracy})
        by_bw = {}
        for e in entries:
            if e["compressor"] == baseline and e["seconds"] is not None:
                by_bw.setdefault(e["bw_bps"], []).append(e["seconds"])
        for e in entries:
            b = by_bw.get(e["bw_bps"])
            e["speedup"] = (statistics.median(b) / e["seconds"]) if b and e["seconds"] else None
        out.append({"group": group_label(group), "baseline": baseline, "target_accuracy": target_acc,
                    "target_loss": target_loss, "rows": entries, "break_even": _break_even(entries, baseline, by_bw)})
    return out


def _break_even(entries: list[dict], baseline: str, base_s: dict[float, list[float]]) -> list[dict]:
    """Per method: where its speedup in time to the target falls through 1 as bandwidth rises, as
    the step-time break-even does; a run that never reached the target counts as slower (0)."""
    out = []
    for label in sorted({e["compressor"] for e in entries if e["compressor"] != baseline}):
        points: dict[float, list[float]] = {}
        for e in entries:
            if e["compressor"] == label and e["bw_bps"] in base_s:
                points.setdefault(e["bw_bps"], []).append(e["speedup"] or 0.0)
        if not points:
            continue
        bws = sorted(points)
        kind, bw = crossing(bws, [statistics.median(points[b]) for b in bws])
        out.append(dataclasses.asdict(Crossing(kind, bw, low_bps=bw or min(bws), high_bps=bw or max(bws)))
                   | {"compressor": label})
    return out
