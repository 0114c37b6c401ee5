"""trace record, import, show and chrome: a run's compute and communication as a file to keep and share, and
as a timeline to look at (docs/replay.md)."""

from __future__ import annotations

import json
import os

import click

from .. import chrometrace, flags, results
from .. import trace as trace_
from .. import tracefile
from ..spec import UserError
from . import console, main
from .render import trace_table


@main.group()
def trace():
    """A run's recorded compute and communication, per rank and step, as a versioned file (docs/replay.md)."""


@trace.command()
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID...]")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory.")
@click.option("-o", "--out", "path", required=True, help="Trace file to write (.json, or .json.gz to compress it).")
def record(run_ids, results_dir, path):
    """Write the trace of a finished run (the latest when RUN_ID is omitted) from the results store;
    of several runs of one job, one trace whose times are, per step and bucket, their medians."""
    conn = results.connect(results_dir, create=False)
    try:
        data = trace_.of_runs([(conn, r) for r in run_ids or [None]])
    finally:
        conn.close()
    tracefile.save(data, path)
    about = trace_.describe(data)
    runs = data["recorded"].get("merged_from") or [data["recorded"]["run_id"]]
    console.print(f"trace of run{'s' if len(runs) > 1 else ''} {', '.join(runs)}"
                  f"{' (per step and bucket, the median of their times)' if len(runs) > 1 else ''}: {len(data['ranks'])} ranks, "
                  f"{about['ranks'][0]['steps']} steps, {about['parameters']} parameters -> {path}")


@trace.command(name="import")
@click.argument("profiles", nargs=-1, required=True, metavar="PROFILE...")
@click.option("-o", "--out", "path", required=True, help="Trace file to write (.json, or .json.gz to compress it).")
def import_(profiles, path):
    """Write a trace from torch.profiler Chrome traces of a DDP job over Gloo (one per rank, any of
    its ranks; profiled with record_shapes=True), to replay where the job cannot run: its buckets,
    their ready times, forward and optimizer times (docs/replay.md, "A torch.profiler trace")."""
    from .. import profiler_import
    data = profiler_import.convert([(p, profiler_import.load_profile(p)) for p in profiles])
    tracefile.save(data, path)
    about = trace_.describe(data)
    console.print(f"trace of {len(profiles)} profiled rank(s) of a {data['job']['nodes']}-rank job: "
                  f"{about['ranks'][0]['steps']} steps, {about['parameters']} buckets of {about['elements']} elements -> {path}")


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


@trace.command()
@click.argument("source", required=False, metavar="[RUN_ID | FILE]")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory.")
@click.option("-o", "--out", "path", required=True, help="Chrome trace to write (JSON).")
def chrome(source, results_dir, path):
    """Write a run (the latest when omitted) or a trace file as a Chrome trace, for Perfetto
    (ui.perfetto.dev) or chrome://tracing: per rank, each step's compute, every bucket's encode,
    collective and decode, and the optimizer."""
    if source is not None and os.path.isfile(source):
        data = tracefile.load(source)
    elif source is not None and (os.sep in source or source.endswith((".json", ".gz"))):
        raise UserError(f"there is no trace file {source}: give a trace file or a run id ('gctestbed show --all').")
    else:
        conn = results.connect(results_dir, create=False)
        try:
            data = trace_.extract(conn, results.find_run(conn, source)["run_id"], host_time=True)
        finally:
            conn.close()
    out = chrometrace.events(data)
    dilate = data["job"].get("dilate", 1)
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, separators=(",", ":"))
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}.") from None
    console.print(f"Chrome trace of {('run ' + data['recorded']['run_id']) if data['recorded'].get('run_id') else 'the imported profile'}: {len(data['ranks'])} ranks, "
                  f"{len(out['traceEvents'])} events -> {path} (open it in ui.perfetto.dev or chrome://tracing)"
                  + (f"; dilated x{dilate:g}: its times are this host's, {dilate:g} times the emulated ones" if dilate != 1 else ""))
