"""trace record and show: a run's compute and communication as a file to keep and share (docs/replay.md)."""

from __future__ import annotations

import json

import click

from .. import results
from .. import trace as trace_
from .. import tracefile
from . import console, main
from .render import trace_table


@main.group()
def trace():
    """A run's recorded compute and communication, per rank and step, as a versioned file (docs/replay.md)."""


@trace.command()
@click.argument("run_id", required=False)
@click.option("--results", "results_dir", default="results", show_default=True, help="Results directory.")
@click.option("-o", "--out", "path", required=True, help="Trace file to write (.json, or .json.gz to compress it).")
def record(run_id, results_dir, path):
    """Write the trace of a finished run (the latest when RUN_ID is omitted) from the results store."""
    conn = results.connect(results_dir, create=False)
    try:
        data = trace_.extract(conn, results.find_run(conn, run_id)["run_id"])
    finally:
        conn.close()
    tracefile.save(data, path)
    about = trace_.describe(data)
    console.print(f"trace of run {data['recorded']['run_id']}: {len(data['ranks'])} ranks, "
                  f"{about['ranks'][0]['steps']} steps, {about['parameters']} parameters -> {path}")


@trace.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def show(path, as_json):
    """Summarise a trace: the job, where it was recorded, and each rank's median step."""
    about = trace_.describe(tracefile.load(path))
    if as_json:
        click.echo(json.dumps(about, indent=1))
    else:
        console.print(trace_table(about))
