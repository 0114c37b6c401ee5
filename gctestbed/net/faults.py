"""Faults on a node's cable mid-run: the link taken down, or made to lose packets.

A link going down is both ends of the node's cable set down, as a pulled cable would be: the
qdiscs stay configured, TCP retransmits into the void, and setting the ends up again resumes
the traffic (a short outage survives, a long one ends in the collective timeout). Loss needs a
stage that can drop: the netem leaf of each end where the kernel has netem, else the delay line,
which every lossy cable then passes through (topology.build, ``lossy``).
"""

from __future__ import annotations

from . import delayline, namespaces, shaping
from ..spec import series_loss_pct
from .topology import Network


def apply(network: Network, rank: int, kind: str, active: bool, pct: float = 0.0) -> None:
    """Start (``active``) or end fault ``kind`` (link-down | loss of ``pct`` %) on ``rank``'s cable."""
    c = network.cables[rank]
    if kind == "link-down":
        for ns, ifname in ((c.a_ns, c.a_if), (c.b_ns, c.b_if)):
            with namespaces.iproute(ns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="down" if active else "up")
        return
    if kind != "loss":
        raise ValueError(f"unknown fault {kind!r}")
    if not c.lossy:
        raise RuntimeError(f"cable of node {rank} was not built for a loss fault (topology.build, lossy)")
    if network.impl == "delayline":
        for direction, d in (("ab", c.hop.ab), ("ba", c.hop.ba)):
            delayline.set_loss(network.relay, rank, direction, _combined(d.loss_pct, pct) if active else d.loss_pct)
    else:
        for ns, ifname, d in ((c.a_ns, c.a_if, c.hop.ab), (c.b_ns, c.b_if, c.hop.ba)):
            with namespaces.iproute(ns) as ipr:
                shaping.set_loss(ipr, ifname, d, _combined(d.loss_pct, pct) if active else d.loss_pct)


def _combined(base_pct: float, extra_pct: float) -> float:
    """The loss of a link that already lost ``base_pct`` when a fault adds ``extra_pct``."""
    return series_loss_pct((base_pct, extra_pct))
