"""One shaped cable between two namespaces, both directions, whatever the kernel offers.

Rate is always htb on each end's egress. Delay, jitter and loss come from a netem leaf under
the htb class (under each of a node's two: shaping) where the kernel has netem, or from the userspace delay line, whose TAP devices
then replace the veth pair. Either way the result is interface ``a_if`` in ``a_ns`` and
``b_if`` in ``b_ns``, shaped, ready to be addressed or bridged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..spec import Direction, Hop
from . import namespaces, shaping

IMPLS = ("none", "netem", "delayline")


@dataclass
class Cable:
    a_ns: str
    a_if: str
    b_ns: str
    b_if: str
    hop: Hop
    lossy: bool = False     # a loss fault may strike it mid-run: netem leaf / per-packet delay line from the start
    a_host: bool = False    # end a is a node's own interface: its egress sends ACKs ahead of data (shaping)


def impaired(d: Direction) -> bool:
    return bool(d.delay_s or d.jitter_s or d.loss_pct)


def create_veth(c: Cable, record: Callable[..., None]) -> None:
    """Join the two ends with a veth pair (when no delay line provides TAP devices instead)."""
    record("link", name=c.a_if, netns=c.a_ns, peer=c.b_if, peer_netns=c.b_ns)
    with namespaces.iproute(c.a_ns) as ipr:
        ipr.link("add", ifname=c.a_if, kind="veth", peer={"ifname": c.b_if, "net_ns_fd": c.b_ns})


def shape(c: Cable, impl: str, record: Callable[..., None]) -> None:
    """Shape both ends' egress; with ``impl`` netem, delay, jitter and loss go on netem leaves."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}")
    for ns, ifname, direction, host in ((c.a_ns, c.a_if, c.hop.ab, c.a_host), (c.b_ns, c.b_if, c.hop.ba, False)):
        with namespaces.iproute(ns) as ipr:
            record("qdisc", dev=ifname, netns=ns)
            shaping.apply(ipr, ifname, direction, netem=impl == "netem", always_netem=c.lossy, host=host)
