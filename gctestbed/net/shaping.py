"""One direction of a link in, traffic-control configuration out (pyroute2 netlink, no tc strings).

Every launcher shapes through this module. An egress gets an htb root with one class whose rate
and ceil are the link rate (htb carries 64-bit rates, so 100gbit works; a host's egress splits
it in two, below) and whose burst is a few milliseconds of that rate but at least two full
frames: a bucket much larger than that never empties and silently removes the limit; a smaller
one cannot keep the link busy. Delay, jitter
and loss, where netem is used for them, are a netem leaf under the class (under each of a host's
two) whose queue holds at least a bandwidth-delay product.

A host's own egress (``host=True``: a node's end of its cable, a shaped NIC) stands for that
host's qdisc and NIC, and Linux hosts' default qdisc, fq_codel, keeps each flow in a queue of its
own and serves a sparse one, such as the pure ACKs a host sends for a flow it receives, ahead of
bulk flows. The kernels this runs on may lack fq_codel, so a host's egress emulates that for pure
ACKs and nothing more (no per-flow queues, fairness or CoDel's delay target: data waits in one
FIFO): its class has two children, ACK_CLASS, guaranteed 1/ACK_SHARE of the rate, which the ACKs
stay within, so htb serves it ahead of BULK, which borrows the rest (the priorities agree, and
only order the two once ACKs exceed their share). A pure ACK is matched by its headers (IPv4
without options, TCP, 32-127 bytes, of FIN, SYN, RST, PSH and ACK only ACK), never by size alone:
a first version that sent every small packet first let a small data segment overtake its own
connection's queued data (docs/replay.md, "Small packets behind bulk data"). What Gloo's ring
waited on was the size of what a node queued, not its order: a node's interface takes GSO
packets of at most 1 ms of its slowest path (topology.gso_segments), one segment on a slow one.
A switch's port stays one FIFO, as a switch's is.
"""

from __future__ import annotations

import errno
import math
from pyroute2 import IPRoute, protocols
from pyroute2.netlink.exceptions import NetlinkError

from ..spec import Direction, UserError

FRAME_BYTES = 1514          # a full Ethernet frame at MTU 1500, headers included
BURST_TIME_S = 0.002        # bucket depth in time at the link rate
PSCHED_TICK_S = 64e-9       # the kernel's psched tick (PSCHED_SHIFT = 6)
ROOT, CLASS, LEAF = 0x10000, 0x10001, 0x100000   # 1:, 1:1, 10:
ACK_CLASS, BULK, ACK_LEAF = 0x10002, 0x10003, 0x200000   # a host's egress: 1:2 first, 1:3 after; 20:
ACK_SHARE = 20              # 1:2 is guaranteed 1/20 of the rate: ample (ring-share at 16 nodes: ~2,100 ACKs of 66 bytes, 0.25 % of a node's 57 MB)
# A pure ACK's IPv4 and TCP headers, as u32 keys (value/mask+offset into the IP header), one filter per length range:
# version 4 without options; an IP length of 32-63 or 64-127 bytes (an ACK with timestamps and SACK blocks is at
# most 80, TCP's options filling at most 40; a BIG TCP frame, whose length field reads 0, is not one); protocol TCP;
# of the flags FIN, SYN, RST, PSH and ACK only ACK (Linux sets PSH on the last segment of every write, so a data
# segment under 128 bytes carries it, and a FIN or RST must not overtake its connection's data; a small segment sent
# without PSH, under MSG_MORE or TCP_CORK, still matches). A key's mask never has a zero byte between others:
# pyroute2 0.9.7 packs masks byte by byte and would close the gap.
_ACK_HEADERS = ["0x45000000/0xff000000+0", "0x00060000/0x00ff0000+8", "0x00100000/0x001f0000+32"]
PURE_ACK_KEYS = [_ACK_HEADERS + ["0x00000020/0x0000ffe0+0"], _ACK_HEADERS + ["0x00000040/0x0000ffc0+0"]]


def burst_bytes(rate_bps: int) -> int:
    """Token-bucket depth for a rate: ~2 ms of traffic, never below two full frames."""
    return max(2 * FRAME_BYTES, math.ceil(rate_bps / 8 * BURST_TIME_S))


def netem_limit_packets(rate_bps: int, delay_s: float) -> int:
    """netem's queue must hold at least a bandwidth-delay product (plus room for bursts)."""
    bdp_packets = rate_bps / 8 * delay_s / FRAME_BYTES
    return max(1000, math.ceil(2 * bdp_packets))


def apply(ipr: IPRoute, ifname: str, d: Direction, netem: bool = False, always_netem: bool = False,
          host: bool = False) -> None:
    """Shape the egress of ``ifname``: htb at ``d.rate_bps``, plus netem for the rest if asked
    (``always_netem``: a netem leaf even with nothing to do yet, for set_loss to change later);
    ``host``: a host's own egress, whose pure ACKs go ahead of its bulk data (module docstring)."""
    index = _index(ipr, ifname)
    rate = d.rate_bps // 8
    burst = burst_bytes(d.rate_bps)
    _tc(ipr, "add", "htb", index, ROOT, default=(BULK if host else CLASS) & 0xFFFF)
    _tc(ipr, "add-class", "htb", index, CLASS, parent=ROOT, rate=rate, ceil=rate, burst=burst, cburst=burst)
    if host:
        for handle, share, prio in _host_classes(rate):
            _tc(ipr, "add-class", "htb", index, handle, parent=CLASS, rate=share, ceil=rate, burst=burst, cburst=burst,
                prio=prio)
        for keys in PURE_ACK_KEYS:
            try:
                ipr.tc("add-filter", "u32", index, parent=ROOT, prio=1, protocol=protocols.ETH_P_IP, target=ACK_CLASS,
                       keys=keys)
            except NetlinkError as e:
                if e.code in (errno.ENOENT, errno.EOPNOTSUPP):
                    raise UserError("this kernel has no u32 classifier (module cls_u32), which a node's egress needs to "
                                    "send its ACKs ahead of its data; load it.") from None
                raise
    if netem and (always_netem or d.delay_s or d.jitter_s or d.loss_pct):
        for parent, leaf in _leaves(host):
            _netem(ipr, "add", index, parent, leaf, d, d.loss_pct)


def _host_classes(rate: int) -> list[tuple[int, int, int]]:
    """A host's two classes under the link's: (handle, guaranteed rate in bytes/s, htb priority)."""
    acks = max(1, rate // ACK_SHARE)
    return [(ACK_CLASS, acks, 0), (BULK, max(1, rate - acks), 1)]


def _leaves(host: bool) -> list[tuple[int, int]]:
    """Where the netem leaves go: (parent class, leaf handle) under the link's class, or under each
    of a host's two classes."""
    return [(ACK_CLASS, ACK_LEAF), (BULK, LEAF)] if host else [(CLASS, LEAF)]


def _netem_parents(ipr: IPRoute, index: int) -> list[tuple[int, int]]:
    """``_leaves`` of an egress ``apply`` shaped, read from its classes (a host's has BULK)."""
    return _leaves(any(c["handle"] == BULK for c in ipr.get_classes(index=index)))


def change(ipr: IPRoute, ifname: str, d: Direction, netem: bool = False) -> None:
    """Give the egress ``apply`` shaped the rate of ``d`` (and, with ``netem``, its delay, jitter
    and loss on the netem leaves ``apply`` made) in place: the qdiscs stay, with their counters."""
    index = _index(ipr, ifname)
    rate = d.rate_bps // 8
    burst = burst_bytes(d.rate_bps)
    _tc(ipr, "change-class", "htb", index, CLASS, parent=ROOT, rate=rate, ceil=rate, burst=burst, cburst=burst)
    parents = _netem_parents(ipr, index)
    if parents[0][0] == ACK_CLASS:
        for handle, share, prio in _host_classes(rate):
            _tc(ipr, "change-class", "htb", index, handle, parent=CLASS, rate=share, ceil=rate, burst=burst,
                cburst=burst, prio=prio)
    if netem:
        for parent, leaf in parents:
            _netem(ipr, "change", index, parent, leaf, d, d.loss_pct)


def set_loss(ipr: IPRoute, ifname: str, d: Direction, loss_pct: float) -> None:
    """Change the loss of the netem leaves ``apply`` put under ``ifname``'s classes, the rest as ``d``."""
    index = _index(ipr, ifname)
    for parent, leaf in _netem_parents(ipr, index):
        _netem(ipr, "change", index, parent, leaf, d, loss_pct)


def _netem(ipr: IPRoute, command: str, index: int, parent: int, leaf: int, d: Direction, loss_pct: float) -> None:
    _tc(ipr, command, "netem", index, leaf, parent=parent, delay=round(d.delay_s * 1e6),
        jitter=round(d.jitter_s * 1e6), loss=loss_pct, limit=netem_limit_packets(d.rate_bps, d.delay_s + d.jitter_s))


def describe(ipr: IPRoute, ifname: str) -> dict:
    """The configuration the kernel reports for ``ifname``: qdiscs, htb classes and counters."""
    index = _index(ipr, ifname)
    qdiscs = [{"kind": q.get_attr("TCA_KIND"), "handle": _handle(q["handle"]), "parent": _handle(q["parent"]),
               **_stats(q)} for q in ipr.get_qdiscs(index=index)]
    classes = []
    for c in ipr.get_classes(index=index):
        entry = {"kind": c.get_attr("TCA_KIND"), "classid": _handle(c["handle"]), "parent": _handle(c["parent"]), **_stats(c)}
        options = c.get_attr("TCA_OPTIONS")
        parms = options.get_attr("TCA_HTB_PARMS") if options else None
        if parms:
            rate = options.get_attr("TCA_HTB_RATE64") or parms["rate"]
            ceil = options.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
            entry.update(rate_bps=rate * 8, ceil_bps=ceil * 8,
                         burst_bytes=round(parms["buffer"] * PSCHED_TICK_S * rate),
                         cburst_bytes=round(parms["cbuffer"] * PSCHED_TICK_S * ceil))
        classes.append(entry)
    return {"qdiscs": qdiscs, "classes": classes}


def link_class(described: dict) -> dict | None:
    """The class that carries the link's rate and every byte sent (1:1), from ``describe``."""
    return next((c for c in described["classes"] if c["classid"] == _handle(CLASS)), None)


def _stats(msg) -> dict:
    stats = msg.get_attr("TCA_STATS2")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
    out = {}
    if basic:
        out.update(sent_bytes=basic["bytes"], sent_packets=basic["packets"])
    if queue:
        out.update(drops=queue["drops"], overlimits=queue["overlimits"])
    return out


def _handle(h: int) -> str:
    if h == 0xFFFFFFFF:
        return "root"
    return f"{h >> 16:x}:{h & 0xFFFF:x}"


def _index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise OSError(errno.ENODEV, f"no interface named {ifname}")
    return found[0]


def _tc(ipr: IPRoute, command: str, kind: str, index: int, handle: int, **kw) -> None:
    try:
        ipr.tc(command, kind, index, handle, **kw)
    except NetlinkError as e:
        if e.code == errno.ENOENT and command == "add":
            raise UserError(f"this kernel has no '{kind}' qdisc (module sch_{kind}); load it or run without the option that needs it.") from None
        raise
