"""One shaped cable between two namespaces, both directions, whatever the kernel offers.

Rate is always htb on each end's egress. Delay, jitter and loss come from a netem leaf under
the htb class where the kernel has netem, or from the userspace delay line, whose TAP devices
then replace the veth pair. Both produce the same thing: interface ``a_if`` in ``a_ns`` and
``b_if`` in ``b_ns``, shaped, ready to be addressed or bridged.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Callable

from ..spec import Direction, Hop
from . import delayline, namespaces, shaping

IMPLS = ("none", "netem", "delayline")


@dataclass
class Cable:
    a_ns: str
    a_if: str
    b_ns: str
    b_if: str
    relay: subprocess.Popen | None = None


def impaired(d: Direction) -> bool:
    return bool(d.delay_s or d.jitter_s or d.loss_pct)


def connect(a_ns: str, a_if: str, b_ns: str, b_if: str, hop: Hop, impl: str, seed: int,
            record: Callable[..., None]) -> Cable:
    """Create and shape the cable; ``impl`` is how delay is made (``none`` when there is none)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}")
    record("link", name=a_if, netns=a_ns, peer=b_if, peer_netns=b_ns)
    relay = None
    if impl == "delayline":
        relay = delayline.start(a_ns, a_if, b_ns, b_if, hop.ab, hop.ba, seed, record)
    else:
        with namespaces.iproute(a_ns) as ipr:
            ipr.link("add", ifname=a_if, kind="veth", peer={"ifname": b_if, "net_ns_fd": b_ns})
    netem = impl == "netem"
    for ns, ifname, direction in ((a_ns, a_if, hop.ab), (b_ns, b_if, hop.ba)):
        with namespaces.iproute(ns) as ipr:
            record("qdisc", dev=ifname, netns=ns)
            shaping.apply(ipr, ifname, direction, netem=netem)
    return Cable(a_ns, a_if, b_ns, b_if, relay)
