"""Shaping an interface gctestbed did not create: shape, unshape."""

from __future__ import annotations


import click

from ..spec import Direction, LinkSpec, format_duration, format_rate, parse_duration, parse_percent, parse_rate

from . import main


@main.command()
@click.option("--dev", required=True, help="The interface to shape, e.g. eth0 (a real NIC, or a container's).")
@click.option("--bw", required=True, help="Egress rate, in tc's units (mbit = bits/s, mbps = BYTES/s).")
@click.option("--latency", default="0", show_default=True, help="One-way delay added on egress (needs netem).")
@click.option("--jitter", default="0", show_default=True, help="Delay variation (needs netem).")
@click.option("--loss", default="0", show_default=True, help="Packet loss in percent (needs netem).")
@click.option("--force", is_flag=True, help="Replace a qdisc gctestbed did not make (unshape puts it back).")
def shape(dev, bw, latency, jitter, loss, force):
    """Shape the egress of interface DEV as a gctestbed link; 'gctestbed unshape' restores what was there."""
    from ..launch.state import state_dir
    from ..net import nic
    link = LinkSpec(bw_bps=parse_rate(bw), latency_s=parse_duration(latency), jitter_s=parse_duration(jitter, "--jitter"),
                    loss_pct=parse_percent(loss, "--loss"))
    link.validate()
    before = nic.shape(dev, Direction(link.bw_bps, link.latency_s, link.jitter_s, link.loss_pct), state_dir(), force)
    click.echo(f"shaped {dev}: {format_rate(link.bw_bps)}, latency {format_duration(link.latency_s)} "
               f"(saved its {before['kind'] or 'default'} qdisc for unshape)")


@main.command()
@click.option("--dev", required=True, help="The interface 'gctestbed shape' shaped.")
def unshape(dev):
    """Remove gctestbed's shaping from DEV and put back the qdisc it had before."""
    from ..launch.state import state_dir
    from ..net import nic
    before = nic.unshape(dev, state_dir())
    click.echo(f"unshaped {dev}: its {before['kind'] or 'default'} qdisc is back")

