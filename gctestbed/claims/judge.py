"""Run a claim's experiments (resumable sweeps in one results store) and judge it from the store."""

from __future__ import annotations

import time
from typing import Callable

from .. import results, sweep
from ..analysis import cells
from ..spec import UserError
from .catalog import BY_ID, CLAIMS, Claim, Context
from .experiments import EXPERIMENTS
from .verdict import combine

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


def run(claims: list[Claim], quick: bool, results_dir: str, repeat: int | None = None, launcher: str = "netns",
        baseline: str = "none", device: str = "cpu", on_cell: Callable[[str, sweep.Cell], None] = lambda name, cell: None) -> None:
    """Run every experiment the claims need, each once, resuming what an earlier call left; with
    another baseline than none, its cells are added beside the method's."""
    for name in dict.fromkeys(e for c in claims for e in c.experiments()):
        exp = EXPERIMENTS[name]
        grid = exp.grid(quick, results_dir=results_dir, launcher=launcher, accept_miss=True, device=device)
        if baseline not in grid.axes["compressor"]:
            grid.axes["compressor"].append(baseline)
        if repeat is not None:
            grid.repeat = repeat
        sweep_name = exp.sweep_name(quick) + (f"-r{repeat}" if repeat is not None else "")
        left = sweep.todo(sweep.plan(grid), sweep_name, results_dir)
        sweep.run(grid, sweep_name, left, on_start=lambda cell: on_cell(sweep_name, cell))


def judge(claim: Claim, quick: bool, results_dir: str, repeat: int | None = None, baseline: str = "none") -> dict:
    """The claim's verdict and every part's measurement, from the store alone."""
    rows_of: dict[str, list[cells.Row]] = {}
    parts = []
    for part in claim.parts:
        exp = EXPERIMENTS[part.experiment]
        name = exp.sweep_name(quick) + (f"-r{repeat}" if repeat is not None else "")
        if name not in rows_of:
            rows_of[name] = _rows(results_dir, name)
        m = part.figure(rows_of[name], Context(lambda text, exp=exp: exp.fill(quick, text), baseline))
        verdict = part.region.judge(m)
        parts.append({"label": part.label, "experiment": part.experiment, "sweep": name, "value": m.value,
                      "low": m.low, "high": m.high, "unit": part.unit, "holds_if": part.region.text(),
                      "region": [part.region.low, part.region.high],
                      "verdict": verdict, "why": m.why, "detail": m.detail})
    scales = {p.experiment: EXPERIMENTS[p.experiment].setup(quick).scale for p in claim.parts}
    return {"id": claim.id, "source": claim.source, "sentence": claim.sentence, "verdict": combine([p["verdict"] for p in parts]),
            "quick": quick, "scale": scales, "toy": quick, "baseline": baseline, "parts": parts, "results_dir": results_dir,
            "cells": {name: len(rows) for name, rows in rows_of.items()}, "judged_at": time.time()}


def _rows(results_dir: str, sweep_name: str) -> list[cells.Row]:
    """The sweep's finished cells; none when it has not run (its parts are then inconclusive)."""
    try:
        conn = results.connect(results_dir, create=False)
    except UserError:
        return []
    names = results.sweep_names(conn)
    conn.close()
    try:
        return cells.load(results_dir, sweep_name) if sweep_name in names else []
    except UserError:                   # the sweep ran but no cell finished
        return []

