"""claims list, run and report: the field's published claims, rerun here with verdicts."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import click
from rich.markup import escape
from rich.table import Table
from rich.console import Console

from .. import interrupts
from ..claims import catalog, judge as judge_, page
from ..claims.experiments import EXPERIMENTS
from ..spec import LAUNCHERS

from . import console, main

BASELINE = click.option("--baseline", type=click.Choice(["none", "fp16", "bf16"]), default="none", show_default=True,
                        help="What the claims' speedups compare against (accuracy is always against none).")
RESULTS = click.option("--results", "results_dir", default=judge_.DEFAULT_RESULTS, show_default=True,
                       help="Results directory: one store for every claim, so experiments run once.")


@main.group()
def claims():
    """The field's claims about gradient compression, rerun on this machine with verdicts (docs/claims.md)."""


@claims.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(as_json):
    """Every claim: its id, source, sentence, the parts it is judged on and the experiments that measure it."""
    rows = [{"id": c.id, "source": c.source, "citation": catalog.SOURCES[c.source], "sentence": c.sentence,
             "source_conditions": c.conditions.describe(), "departs": c.conditions.method, "experiments": c.experiments(),
             "parts": [{"label": p.label, "experiment": p.experiment, "holds_if": p.region.text(), "unit": p.unit}
                       for p in c.parts],
             "quick_scale": {e: EXPERIMENTS[e].quick.scale for e in c.experiments()},
             "full_scale": {e: EXPERIMENTS[e].full.scale for e in c.experiments()}} for c in catalog.CLAIMS]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="claims (gctestbed claims run ID --quick)", show_lines=True)
    for col in ("id", "source", "claim", "the source's conditions", "judged on"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["source"], r["sentence"], r["source_conditions"] + (f" ({r['departs']})" if r["departs"] else ""),
                      "; ".join(f"{p['label']}: {p['holds_if']}" for p in r["parts"]))
    Console(width=max(Console().width, 140)).print(table)


def _table(results: list[dict]) -> Table:
    table = Table(title="claims", show_lines=True)
    for col in ("id", "verdict", "claim", "measured (interval)", "scale"):
        table.add_column(col)
    for c in results:
        measured = "\n".join(f"{p['label']}: {page.fmt(p['value'], p['unit'])} {page.interval(p)}, "
                             f"holds if {p['holds_if']}: {p['verdict']}"
                             + (f" ({p['why']})" if p["why"] else "") for p in c["parts"])
        table.add_row(c["id"], c["verdict"], escape(c["sentence"]), escape(measured),
                      ("toy scale; " if c["toy"] else "") + "; ".join(c["scale"].values()))
    return table


def _show(results: list[dict], controls: list[dict], out: str, as_json: bool, doc: str | None = None,
          heading: str = "") -> None:
    report = page.write(results, out, controls)
    if doc:
        page.write_doc(doc, report, heading)
    if as_json:
        click.echo(page.to_json(report))
        return
    Console(width=max(Console().width, 160)).print(_table(results))
    click.echo(f"report: {os.path.join(out, 'report.html')} (claims.json, one picture per claim)")


@claims.command(name="run")
@click.argument("ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every claim.")
@click.option("--quick", is_flag=True, help="The scale that fits a 2-core machine (each claim's experiments in about "
                                            "twenty minutes or less); without it, the sources' sizes for speed and the "
                                            "accuracy tasks longer over five seeds.")
@click.option("--repeat", type=int, default=None, help="Runs per cell (default: 1 quick, 3 full); more narrows the intervals.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="netns", show_default=True, help="Where the nodes run.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: one GPU per node and NCCL (kept on the shaped links by socket transport).")
@BASELINE
@RESULTS
@click.option("--out", default=None, help="Where to write report.html, claims.json and the pictures (default: RESULTS/claims-report).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option("--doc", default=None, metavar="FILE.md",
              help="Also write the verdicts into FILE.md, between its claims:begin and claims:end markers (docs/claims.md).")
def run_(ids, every, quick, repeat, launcher, device, baseline, results_dir, out, as_json, doc):
    """Run the experiments of the claims ID... (or --all), resumably, and judge them."""
    chosen = judge_.select(ids, every)
    started = time.time()
    if repeat is not None and repeat < 1:
        raise click.BadParameter("must be at least 1", param_hint="--repeat")
    try:
        with console.status("measuring") as status:
            judge_.run(chosen, quick, results_dir, repeat, launcher, baseline, device,
                       on_cell=lambda name, cell: status.update(f"{name}: {cell.params['compressor']} @ "
                                                                f"{cell.params['bw']}, {cell.params['workload']}"))
    except (interrupts.Interrupted, KeyboardInterrupt):
        console.print("interrupted: the current cell was torn down; run the same command again to resume")
        sys.exit(130)
    results, controls = judge_.judge_all(chosen, quick, results_dir, repeat, baseline, device)
    took = time.time() - started
    _show(results, controls, out or os.path.join(results_dir, "claims-report"), as_json, doc,
          f"## Verdicts, generated by `gctestbed claims run {' '.join(ids) or '--all'}{' --quick' if quick else ''}` "
          f"({time.strftime('%d %B %Y', time.gmtime())}, {socket.gethostname()}, {device}, {took / 60:.0f} min for this command; "
          "cells an earlier, interrupted one finished are not counted)")


@claims.command(name="report")
@click.argument("ids", nargs=-1)
@click.option("--quick/--full", default=True, show_default=True, help="Which scale's measurements to judge.")
@click.option("--repeat", type=int, default=None, help="The --repeat the claims were run with, if one was given.")
@BASELINE
@RESULTS
@click.option("--out", default=None, help="Where to write report.html, claims.json and the pictures (default: RESULTS/claims-report).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option("--doc", default=None, metavar="FILE.md",
              help="Also write the verdicts into FILE.md, between its claims:begin and claims:end markers (docs/claims.md).")
def report_(ids, quick, repeat, baseline, results_dir, out, as_json, doc):
    """Judge every claim (or ID...) from what the store holds, without running anything; a claim whose
    experiments have not run is inconclusive, and says so."""
    chosen = judge_.select(ids, not ids)
    results, controls = judge_.judge_all(chosen, quick, results_dir, repeat, baseline)
    _show(results, controls, out or os.path.join(results_dir, "claims-report"), as_json, doc,
          f"## Verdicts, judged by `gctestbed claims report{' --quick' if quick else ' --full'}` from {results_dir} "
          f"({time.strftime('%d %B %Y', time.gmtime())})")
