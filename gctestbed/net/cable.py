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
GSO_TIME_S = 0.001          # a GSO packet is at most this much of its link's time (gso_segments)
GSO_MAX_SEGS = 65535        # the kernel's own limit (GSO_MAX_SEGS), the default of every device


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
            if host:
                limit_gso(ipr, ifname, direction.rate_bps)
            record("qdisc", dev=ifname, netns=ns)
            shaping.apply(ipr, ifname, direction, netem=impl == "netem", always_netem=c.lossy, host=host)


def gso_segments(rate_bps: int) -> int:
    """How many segments a node's TCP may hand its interface in one GSO packet: what the link
    carries in GSO_TIME_S, at least one. An htb lets a GSO packet through at once and then holds
    its class in debt for the time the packet is worth at the rate, and the switch's port behind
    does the same, so a short message to that port's node, from any node, waits out the debt: 64
    KB are 54 ms at 10 Mbit/s (by hand, a node's ACKs waited 26-31 ms on average, against 0.7-1.3
    with one segment a packet; docs/replay.md, "One frame at a time"). A real switch's port takes
    a host's frames one at a time and interleaves other hosts' with them. Linux sizes its own GSO
    packets to about 1 ms of a flow's pacing rate, the same bound; a node's TCP cannot, its veth
    being as fast as the host. Fewer segments cost the host CPU (at 1gbit with 5 ms of delay line,
    one a packet read 771-905 Mbit/s where GSO packets read 915-1004), so a fast link keeps them."""
    return max(1, int(rate_bps / 8 * GSO_TIME_S // shaping.FRAME_BYTES))


def limit_gso(ipr, ifname: str, rate_bps: int) -> None:
    """Give ``ifname``, a node's own interface, the GSO packets ``gso_segments`` allows at ``rate_bps``."""
    ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], gso_max_segs=min(gso_segments(rate_bps), GSO_MAX_SEGS))
