"""Run a claim's experiments (resumable sweeps in one results store) and judge it from the store."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from .. import results, sweep
from ..analysis import cells
from ..spec import UserError
from . import conditions
from . import figures as F
from .catalog import BY_ID, CLAIMS, Claim, Context, Part
from .experiments import EXPERIMENTS
from .verdict import AGREE, DISAGREE, INCONCLUSIVE, OUT_OF_SCOPE, combine

DEFAULT_RESULTS = "results/claims"


def select(ids: tuple[str, ...], every: bool) -> list[Claim]:
    """The claims asked for, by id, or all of them; a sentence for an unknown id."""
    if every:
        return list(CLAIMS)
    if not ids:
        raise UserError("name a claim (gctestbed claims list shows them) or pass --all.")
    unknown = [i for i in ids if i not in BY_ID]
    if unknown:
        raise UserError(f"there is no claim '{unknown[0]}'; the claims are {', '.join(BY_ID)} ('gctestbed claims list').")
    return [BY_ID[i] for i in dict.fromkeys(ids)]


def in_scope(claim: Claim, quick: bool, device: str) -> list[Part]:
    """The claim's parts whose conditions this host can meet at this scale on ``device``."""
    return [p for p in claim.parts if not _outside(claim, p, quick, device)]


def _outside(claim: Claim, part: Part, quick: bool, device: str) -> list[str]:
    return conditions.mismatches(claim.conditions, _here(part.experiment, quick, device), part.needs)


def _here(experiment: str, quick: bool, device: str) -> conditions.Here:
    exp = EXPERIMENTS[experiment]
    return conditions.here({axis: [exp.fill(quick, v) for v in values] for axis, values in exp.axes.items()}, device)


def run(claims: list[Claim], quick: bool, results_dir: str, repeat: int | None = None, launcher: str = "netns",
        baseline: str = "none", device: str = "cpu", on_cell: Callable[[str, sweep.Cell], None] = lambda name, cell: None) -> None:
    """Run every experiment the claims' parts in scope need, each once, resuming what an earlier
    call left (an experiment only out-of-scope parts read is not run: its verdict would not
    depend on it); with another baseline than none, its cells are added beside the method's."""
    needed = [p.experiment for c in claims for p in in_scope(c, quick, device)]
    for name in dict.fromkeys(needed):
        exp = EXPERIMENTS[name]
        grid = _grid(exp, quick, results_dir, repeat, baseline, launcher, device)
        sweep_name = _sweep(exp, quick, repeat)
        left = sweep.todo(sweep.plan(grid), sweep_name, results_dir)
        sweep.run(grid, sweep_name, left, on_start=lambda cell: on_cell(sweep_name, cell))


def judge_all(claims: list[Claim], quick: bool, results_dir: str, repeat: int | None = None, baseline: str = "none",
              device: str | None = None) -> tuple[list[dict], list[dict]]:
    """Every claim's judgement (``judge``) and the experiments' positive controls (``controls``),
    each experiment's cells read from the store once per baseline (the controls are against none):
    several claims read one experiment, and a full tier's cells take a minute or more to summarise."""
    reads: dict[tuple[str, str], Read] = {}
    return ([judge(c, quick, results_dir, repeat, baseline, device, reads) for c in claims],
            controls(claims, quick, results_dir, repeat, reads))


def judge(claim: Claim, quick: bool, results_dir: str, repeat: int | None = None, baseline: str = "none",
          device: str | None = None, reads: dict[tuple[str, str], Read] | None = None) -> dict:
    """The claim's verdict and every part's measurement, from the store alone. A part measured
    outside its source's conditions is out of scope here, with the reasons; an accuracy part of an
    experiment whose positive control did not lose beyond the part's margin is inconclusive.
    ``reads``: the experiments' cells already read from this store (``judge_all`` shares them)."""
    read_of: dict[str, Read] = {}
    reads = {} if reads is None else reads
    parts, devices = [], {}
    for part in claim.parts:
        exp = EXPERIMENTS[part.experiment]
        name = _sweep(exp, quick, repeat)
        if name not in read_of:
            read_of[name] = _read(reads, results_dir, exp, quick, repeat, baseline)
        read = read_of[name]
        rows = read.rows
        ctx = Context(lambda text, exp=exp: exp.fill(quick, text), baseline)
        # as the runs were made: the cells read, else any other finished cell of the sweep
        made = read.rows or read.stale or read.unplanned
        dev = devices[part.experiment] = _device_of(made) if made else (device or "cpu")
        outside = _outside(claim, part, quick, dev)
        entry = {"label": part.label, "experiment": part.experiment, "sweep": name, "unit": part.unit,
                 "holds_if": part.region.text(), "disagrees_if": part.region.disagree_text(),
                 "region": [part.region.low, part.region.high], "needs": list(part.needs),
                 "out_of_scope": outside}
        if outside:
            parts.append({**entry, "value": None, "low": None, "high": None, "verdict": OUT_OF_SCOPE,
                          "why": "out of scope here, because " + "; ".join(outside), "detail": {}})
            continue
        if not _can_compare(exp, quick, baseline) and part.times:
            parts.append({**entry, "value": None, "low": None, "high": None, "verdict": INCONCLUSIVE,
                          "why": f"{part.experiment} replays traces and holds none of {baseline} to compare against",
                          "detail": {}})
            continue
        left_out = ""
        if part.times:      # a speed: repeats the host paced are its figures, not the emulated cluster's
            rows, left_out = unpaced(rows)
        m = part.figure(rows, ctx)
        if left_out:
            m = dataclasses.replace(m, why=(m.why + "; " if m.why else "") + left_out)
        verdict, why = part.region.judge(m), m.why
        if part.times and verdict in (AGREE, DISAGREE):
            verdict, why = unpaired(m, (repeat or exp.setup(quick).repeat), verdict, why)
        if m.value is None:
            why += read.note(name)
        if ctx.counted:          # (a figure that read no bytes reads the same on either count)
            verdict, why, m = _both_counts(part, rows, ctx, m, verdict, why)
        if margin(part) and exp.control and m.value is not None and m.detail.get("method") != exp.control:
            # (a part that measures the control itself is the control's own evidence, judged as it is)
            too_easy = control_too_easy(rows, exp.control, margin(part))
            if too_easy:
                verdict, why = INCONCLUSIVE, too_easy + read.note(name)
        if verdict in (AGREE, DISAGREE) and "trend" in m.detail:
            verdict, why = still_moving(part, m, verdict, why)
        parts.append({**entry, "value": m.value, "low": m.low, "high": m.high, "verdict": verdict, "why": why,
                      "detail": m.detail})
    scales = {p.experiment: EXPERIMENTS[p.experiment].setup(quick).scale for p in claim.parts}
    return {"id": claim.id, "source": claim.source, "sentence": claim.sentence, "verdict": combine([p["verdict"] for p in parts]),
            "quick": quick, "scale": scales,
            "toy": quick or any(EXPERIMENTS[p.experiment].setup(quick).toy for p in claim.parts), "baseline": baseline, "parts": parts, "results_dir": results_dir,
            "source_conditions": claim.conditions.describe(), "caveat": claim.conditions.caveat,
            "conditions_here": {e: _here(e, quick, d).describe() for e, d in devices.items()},
            "cells": {name: len(r.rows) for name, r in read_of.items()},
            # what the cells read took to run, each from its start to its end (the store's times)
            "run_s": {name: sum(x.run_s or 0.0 for x in r.rows) for name, r in read_of.items()},
            "cells_stale": {name: len(r.stale) for name, r in read_of.items()},
            "cells_unplanned": {name: len(r.unplanned) for name, r in read_of.items()}, "judged_at": time.time()}


SETTING = tuple(k for k in cells.SAME_CELL if k not in ("workload", "compressor", "bw_bps", "latency_s"))


def unpaced(rows: list[cells.Row]) -> tuple[list[cells.Row], str]:
    """The rows the host paced none of (a replay marked HOST-BOUND: its step was this host's, not the
    emulated cluster's): a paced run's seed is left out of its setting for every method, so the
    methods still pair by seed there; and what was left out, in words ("" when nothing was)."""
    def setting(r: cells.Row) -> tuple:     # the cell but its method (a replay's workload names its method's trace)
        return (r.seed, r.bw_bps, r.latency_s, *(getattr(r, k) for k in SETTING))
    paced = {setting(r) for r in rows if r.paced}
    if not paced:
        return rows, ""
    from ..spec import format_duration, format_rate
    n = sum(1 for r in rows if r.paced)
    where = ", ".join(f"seed {s[0]} at {format_rate(s[1])}" + (f" and {format_duration(s[2])}" if s[2] else "")
                      for s in sorted(paced))
    return [r for r in rows if setting(r) not in paced], (
        f"left out, where the host paced a run ({n} of {len(rows)} runs HOST-BOUND): {where}")


def unpaired(m: F.Measure, planned: int, verdict: str, why: str) -> tuple[str, str]:
    """A speed of an experiment that plans repeats, judged on fewer than two runs a side (the others
    left out as paced, or not run): inconclusive. Its interval would then come from inside one run
    a side, the spread of its steps, where the repeats were planned because that spread leaves out
    what changes from run to run."""
    n = m.detail.get("n")      # (a figure over several, a median, a share or a quotient, has its parts' fewest)
    if planned < 2 or not isinstance(n, int) or n >= 2:
        return verdict, why
    return INCONCLUSIVE, "; ".join(x for x in (why, f"{planned} repeats were planned and fewer than two runs a side "
                                                   f"are read: {m.value:.3g} [{m.low:.3g}, {m.high:.3g}], from one run "
                                                   f"a side, would read {verdict}") if x)


def still_moving(part: Part, m: F.Measure, verdict: str, why: str) -> tuple[str, str]:
    """An accuracy gap judged agree or disagree, with how it moved over the run's second half
    beside it (figures._trend). Where it was still moving toward the region's edge nearest it at
    the end (its change's whole interval on that side of 0), the verdict is inconclusive: the
    sources trained to convergence, and a longer run here might cross the edge ("closing" where the
    gap shrank toward 0, "widening" where it grew). Otherwise the verdict stands, and the note says
    how the gap moved (and, where its mean moved toward the edge, that the move was not shown)."""
    t = m.detail["trend"]
    moved = (f"the gap moved {t['change']:+.2f} points [{t['low']:+.2f}, {t['high']:+.2f}] from step "
             f"{t['from_step']} to {t['to_step']} (paired, {t['n']} seeds)")
    edge = min((e for e in (part.region.low, part.region.high) if e is not None), key=lambda e: abs(e - m.value))
    toward = 1.0 if edge > m.value else -1.0
    how = "closing" if toward * m.value < 0 else "widening"
    if (toward > 0 and t["low"] > 0) or (toward < 0 and t["high"] < 0):
        return INCONCLUSIVE, (f"still {how} at the end of the run: {moved}; a longer run might "
                              f"{'not disagree' if verdict == DISAGREE else 'disagree'}")
    shown = f": not shown to be {how}" if t["change"] * toward > 0 else ""
    return verdict, "; ".join(x for x in (why, moved + shown) if x)


def _both_counts(part: Part, rows: list[cells.Row], ctx: Context, wire: F.Measure, verdict: str, why: str):
    """A figure that reads bytes, judged again on the methods' payloads (catalog.Context.count):
    the wire adds headers and framing the sources did not count, so a verdict stands only where
    both counts give it; otherwise inconclusive, and the payloads' figure rides in the detail.
    Where the payloads are not believed anywhere in the figure, or give no figure, the wire
    judges alone."""
    try:
        alt = part.figure(rows, dataclasses.replace(ctx, count="payload"))
    except F.NotBelieved as e:        # somewhere in the figure: the wire judges alone
        return verdict, why, dataclasses.replace(wire, detail={**wire.detail, "payload_count": f"not read: {e}"})
    if wire.value is None or alt.value is None:
        return verdict, why, wire         # (a payload figure missing where the wire's is not: the wire judges alone)
    other = part.region.judge(alt)
    detail = {**wire.detail, "payload_count": {"value": alt.value, "low": alt.low, "high": alt.high, "verdict": other}}
    if other != verdict:
        verdict, why = INCONCLUSIVE, (f"the interface counters say {verdict} ({wire.value:.3g} [{wire.low:.3g}, "
                                      f"{wire.high:.3g}]) and the payloads alone {other} ({alt.value:.3g} [{alt.low:.3g}, "
                                      f"{alt.high:.3g}]): the headers and framing the source did not count would decide it")
    return verdict, why, dataclasses.replace(wire, detail=detail)


def controls(claims: list[Claim], quick: bool, results_dir: str, repeat: int | None = None,
             reads: dict[tuple[str, str], Read] | None = None) -> list[dict]:
    """The positive control of each accuracy experiment the claims read, as measured: its accuracy
    against none, with the interval, n, and whether it lost more than one point, its whole
    interval clear (a part with a wider margin asks more of it: judge's gate); experiments that
    have not run are left out."""
    out = []
    for exp in (EXPERIMENTS[e] for e in dict.fromkeys(p.experiment for c in claims for p in c.parts)):
        read = _read({} if reads is None else reads, results_dir, exp, quick, repeat)
        if not exp.control or not (read.rows or read.stale):
            continue
        m = F.accuracy_delta(read.rows, exp.control, "none")
        loses = not control_too_easy(read.rows, exp.control, 1.0)
        out.append({"experiment": exp.name, "control": exp.control, "value": m.value, "low": m.low, "high": m.high,
                    "n": m.detail.get("n"), "loses": loses,
                    "why": (m.why + ("" if loses else read.note(_sweep(exp, quick, repeat)))).removeprefix("; ")})
    return out


def _device_of(rows: list[cells.Row]) -> str:
    """What the experiment's runs computed on: cpu, cuda, or mixed (some of each)."""
    kinds = {r.device for r in rows}
    return "mixed" if len(kinds) > 1 else (kinds.pop() if kinds else "cpu")


def margin(part: Part) -> float | None:
    """The accuracy margin a part judges by, in points, or None for a part that reads no accuracy:
    its own (``Part.margin``: a figure that is not in points but tells kept accuracy from lost by
    one), else the edge of its region away from zero (a loss of at most one point: 1), at least one."""
    if part.margin is not None:
        return part.margin
    if part.unit != "pt":
        return None
    edges = [abs(e) for e in (part.region.low, part.region.high) if e is not None]
    return max([1.0] + edges)


def control_too_easy(rows: list[cells.Row], control: str, points: float) -> str:
    """Why the experiment cannot tell a loss of ``points`` from none, or "" when it can: its
    positive control (a method that must lose) must lose more than that, its whole interval clear."""
    c = F.accuracy_delta(rows, control, "none")
    if c.value is None:
        return f"inconclusive: the positive control ({control}) was not measured: {c.why}"
    if c.high < -points:
        return ""
    return (f"inconclusive: task too easy to tell: the positive control ({control}) lost {-c.value:.2f} points "
            f"[{-c.high:.2f}, {-c.low:.2f}], not clearly more than {points:g}")


def _sweep(exp, quick: bool, repeat: int | None) -> str:
    """The sweep an experiment's cells are stored under (a --repeat run has its own)."""
    return exp.sweep_name(quick) + (f"-r{repeat}" if repeat is not None else "")


def _can_compare(exp, quick: bool, baseline: str) -> bool:
    """Whether the experiment can run ``baseline``: any method, unless its workloads are replays,
    whose traces must hold one recorded with it (a directory of one job's, one per method)."""
    held = [conditions.replay_methods(exp.fill(quick, w)) for w in exp.axes["workload"]]
    return all(m is None or baseline in m for m in held)


def _grid(exp, quick: bool, results_dir: str, repeat: int | None = None, baseline: str = "none",
          launcher: str = "netns", device: str = "cpu") -> sweep.Grid:
    """The experiment's sweep as ``run`` makes it: the baseline's cells beside the methods' (when
    it is not one of them), and a --repeat run's count."""
    grid = exp.grid(quick, results_dir=results_dir, launcher=launcher, accept_miss=True, device=device)
    if baseline not in grid.axes["compressor"] and _can_compare(exp, quick, baseline):
        grid.axes["compressor"].append(baseline)
    if repeat is not None:
        grid.repeat = repeat
    return grid


# what a stored cell must have been run with to be read: what the experiment now gives its cells
# (sweep.SETTINGS), but the seed, which the figures' own check of independent repeats judges (a
# shared seed is named there, not silently dropped), and the device, which the device gate judges
JUDGED = tuple(s for s in sweep.SETTINGS if s not in ("seed", "device"))


@dataclasses.dataclass
class Read:
    """An experiment's finished cells: those the judge reads, the stale ones (cells it plans,
    finished with other settings: a resumed ``claims run`` runs them again), and the rest (cells
    this judging does not plan: an older version's, or another ``--baseline``'s; not read here)."""

    rows: list[cells.Row] = dataclasses.field(default_factory=list)
    stale: list[cells.Row] = dataclasses.field(default_factory=list)
    unplanned: list[cells.Row] = dataclasses.field(default_factory=list)

    def note(self, name: str) -> str:
        """What a part with no figure, or a control not clearly losing, says of the experiment's
        stale cells (whichever methods they are: they may or may not be the ones it lacks)."""
        n = len(self.stale)
        one = n == 1
        return (f"; {name} has {n} finished cell{'' if one else 's'} not read, run with other settings (steps, "
                f"learning rate, ...) than the experiment now gives: a resumed `claims run` runs "
                f"{'it' if one else 'them'} again") if n else ""


def _read(reads: dict[tuple[str, str], Read], results_dir: str, exp, quick: bool, repeat: int | None = None,
          baseline: str = "none") -> Read:
    """``_rows``, once per sweep and baseline in ``reads``."""
    key = (_sweep(exp, quick, repeat), baseline)
    if key not in reads:
        reads[key] = _rows(results_dir, exp, quick, repeat, baseline)
    return reads[key]


def _rows(results_dir: str, exp, quick: bool, repeat: int | None = None, baseline: str = "none") -> Read:
    """The experiment's finished cells as it now stands: of the cells its grid plans, those run
    with the steps, learning rate, evaluation interval, bucket cap, CPUs and dilation it now gives
    them (``JUDGED``) are read. Cells an older version of it left under the same sweep name
    (another task, fewer steps) are never read beside the new ones. Nothing read when it has not
    run (its parts are then inconclusive)."""
    name = _sweep(exp, quick, repeat)
    try:
        conn = results.connect(results_dir, create=False)
    except UserError:
        return Read()
    try:
        if name not in results.sweep_names(conn):
            return Read()
        planned = sweep.plan(_grid(exp, quick, results_dir, repeat, baseline))
        kept = set(sweep.standing(planned, name, conn, JUDGED).values())
        keys = {(c.key, c.repeat) for c in planned}
        unplanned = {r["run_id"] for r in results.sweep_runs(conn, name) if (r["cell"], r["repeat"]) not in keys}
    finally:
        conn.close()
    try:
        rows = cells.load(results_dir, name)
    except UserError:                   # the sweep ran but no cell finished
        return Read()
    return Read([r for r in rows if r.run_id in kept],
                [r for r in rows if r.run_id not in kept and r.run_id not in unplanned],
                [r for r in rows if r.run_id in unplanned])
