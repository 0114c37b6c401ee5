"""The interactive testbed (up, exec, ls, down, calibrate) and doctor."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console

from .. import doctor, flags, testbed
from ..spec import RunSpec

from . import console, main
from .options import network_options
from .render import calibration_table, cluster_table, doctor_table, listing_table


def _network_spec(nodes, bw, bw_down, latency, jitter, loss, latency_impl, topology_file) -> RunSpec:
    return flags.build_spec(nodes=nodes, bw=bw, bw_down=bw_down, latency=latency, jitter=jitter, loss=loss,
                            latency_impl=latency_impl, topology_file=topology_file)


@main.command()
@network_options
def up(**network):
    """Bring a shaped cluster up and leave it running; prints its name."""
    state = testbed.up(_network_spec(**network))
    console.print(cluster_table(state))
    console.print(f"run programs in it with: gctestbed exec gct-{state.run_id} NODE -- CMD ...; "
                  f"remove it with: gctestbed down gct-{state.run_id}")
    click.echo(f"gct-{state.run_id}")


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(name, node, command):
    """Run COMMAND inside NODE (a rank or namespace) of cluster NAME: gctestbed exec NAME 0 -- CMD ..."""
    testbed.exec_in(name, node, list(command))


@main.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ls_(as_json):
    """List clusters brought up with 'up' and runs in progress."""
    rows = testbed.listing()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    Console().print(listing_table(rows) if rows else "no clusters or runs")


@main.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Also tear down the network of a run that is still going.")
def down(name, force):
    """Remove cluster NAME and everything it made."""
    problems = testbed.down(name, force)
    if problems:
        click.echo("could not remove: " + "; ".join(problems), err=True)
        sys.exit(1)
    click.echo(f"removed {name}")


@main.command(name="calibrate")
@click.argument("name", required=False)
@network_options
@click.option("--seconds", default=3.0, show_default=True, help="Measured seconds per path (after a 1 s warm-up); a lossy path is measured "
                   "until it should have met 50 losses, up to 8 s (or this, if longer).")
@click.option("--tool", type=click.Choice(["auto", "iperf3", "builtin"]), default="auto", show_default=True,
              help="Throughput tool: iperf3 when installed, else the built-in TCP probe.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--results", "results_dir", default=flags.DEFAULTS["results_dir"], show_default=True, help="Results directory.")
def calibrate_(name, seconds, tool, as_json, results_dir, **network):
    """Measure throughput and RTT of every path of cluster NAME, or of a cluster built from the flags."""
    cluster_id, paths = testbed.calibrate(name, None if name else _network_spec(**network), seconds, tool, results_dir)
    if as_json:
        click.echo(json.dumps([p.to_dict() for p in paths], indent=2))
    else:
        Console().print(calibration_table(cluster_id, paths))
    if any(p.miss for p in paths):
        click.echo("gctestbed: " + "; ".join(p.miss for p in paths if p.miss), err=True)
        sys.exit(1)


@main.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor_(as_json):
    """Check what this host can do: privileges, kernel features (tried, not guessed), tools, CUDA/NCCL."""
    checks = doctor.diagnose()
    if as_json:
        click.echo(json.dumps(doctor.to_json(checks), indent=2))
        return
    Console().print(doctor_table(checks))

