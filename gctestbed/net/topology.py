"""A TopologySpec made real: switch namespaces with bridges, node namespaces, shaped cables.

Every switch is a namespace of its own holding a bridge (not the host's namespace: a running
dockerd makes host bridges drop forwarded traffic). A node's cable runs from its ``eth0`` to a
port of its switch's bridge; trunks join bridges. All nodes share one flat /24, so any node
reaches any other through the cables of the path between them, each direction shaped on the
egress it leaves by.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Callable

from ..spec import TopologySpec, UserError
from . import cable, delayline, namespaces, probe, shaping

Record = Callable[..., None]


@dataclass
class NodePort:
    rank: int
    netns: str
    address: str
    switch_ns: str
    port: str


@dataclass
class Network:
    prefix: str
    impl: str
    switches: dict[str, str]               # switch name -> namespace
    nodes: list[NodePort]
    cables: list[cable.Cable] = field(default_factory=list)

    def describe(self) -> dict:
        """The configuration the kernel reports on every shaped egress, with its counters."""
        out = {}
        for c in self.cables:
            for ns, ifname in ((c.a_ns, c.a_if), (c.b_ns, c.b_if)):
                if namespaces.exists(ns):
                    with namespaces.iproute(ns) as ipr:
                        out[f"{ns}/{ifname}"] = shaping.describe(ipr, ifname)
        return out

    def stop_relays(self) -> dict:
        """Stop the delay lines and return their counters by cable."""
        return {f"{c.a_ns}/{c.a_if}": delayline.stop(c.relay) for c in self.cables if c.relay}


def choose_impl(requested: str, topo: TopologySpec, probe_ns: str, record: Record) -> str:
    """How delay, jitter and loss are made: the delay line when asked for by name (even with
    nothing to delay, to measure the line itself), else ``none`` when no hop needs them, else
    netem or the delay line (``auto`` prefers netem, probed on a scratch link)."""
    if requested == "delayline":
        return "delayline"
    hops = [n.hop for n in topo.nodes] + [t.hop for t in topo.trunks]
    if not any(cable.impaired(d) for h in hops for d in (h.ab, h.ba)):
        return "none"
    has_netem = probe.qdisc_available(probe_ns, "netem", record)
    if requested == "netem" and not has_netem:
        raise UserError("--latency-impl netem was asked for but this kernel has no netem qdisc (sch_netem): "
                        "use --latency-impl auto or delayline.")
    return "netem" if has_netem else "delayline"


def build(prefix: str, subnet: str, topo: TopologySpec, latency_impl: str, seed: int, record: Record) -> Network:
    """Create everything; each object goes through ``record`` before it exists."""
    net = ipaddress.ip_network(subnet)
    switches = {}
    for i, name in enumerate(topo.switches):
        ns = f"{prefix}-sw{i}"
        record("netns", name=ns, switch=name)
        namespaces.create(ns)
        with namespaces.iproute(ns) as ipr:
            record("link", name=f"{prefix}-br", netns=ns)
            ipr.link("add", ifname=f"{prefix}-br", kind="bridge")
            ipr.link("set", index=ipr.link_lookup(ifname=f"{prefix}-br")[0], state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        switches[name] = ns
    impl = choose_impl(latency_impl, topo, next(iter(switches.values())), record)
    network = Network(prefix=prefix, impl=impl, switches=switches, nodes=[])
    for rank, attach in enumerate(topo.nodes):
        node_ns, port, sw_ns = f"{prefix}-n{rank}", f"{prefix}-p{rank}", switches[attach.switch]
        record("netns", name=node_ns)
        namespaces.create(node_ns)
        network.cables.append(cable.connect(node_ns, "eth0", sw_ns, port, attach.hop, impl, seed * 1000 + rank, record))
        address = str(net[rank + 1])
        with namespaces.iproute(node_ns) as ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            ipr.addr("add", index=index, address=address, prefixlen=net.prefixlen)
            ipr.link("set", index=index, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        _bridge(sw_ns, prefix, port)
        network.nodes.append(NodePort(rank, node_ns, address, sw_ns, port))
    for j, trunk in enumerate(topo.trunks):
        a_ns, b_ns = switches[trunk.a], switches[trunk.b]
        a_if, b_if = f"{prefix}-t{j}a", f"{prefix}-t{j}b"
        network.cables.append(cable.connect(a_ns, a_if, b_ns, b_if, trunk.hop, impl, seed * 1000 + 500 + j, record))
        _bridge(a_ns, prefix, a_if)
        _bridge(b_ns, prefix, b_if)
    return network


def _bridge(ns: str, prefix: str, ifname: str) -> None:
    with namespaces.iproute(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, master=ipr.link_lookup(ifname=f"{prefix}-br")[0], state="up")
