"""The default topology: N node namespaces on veths to one bridge in its own switch namespace.

The bridge lives in a namespace of its own rather than the host's because a running dockerd
makes the host's bridges drop forwarded traffic (br_netfilter + iptables FORWARD DROP). Each
direction of a node's link is shaped on an egress: the uplink on the node's ``eth0``, the
downlink on the switch-side port, so both directions are real queues with real drops.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable

from ..spec import UserError
from . import namespaces, probe, shaping

Record = Callable[..., None]


@dataclass
class NodePort:
    rank: int
    netns: str
    address: str
    switch_port: str


@dataclass
class Star:
    switch_ns: str
    bridge: str
    prefixlen: int
    nodes: list[NodePort]

    def describe(self) -> dict:
        """The qdisc configuration the kernel reports on every shaped egress."""
        out = {}
        for node in self.nodes:
            with namespaces.iproute(node.netns) as ipr:
                out[f"{node.netns}/eth0"] = shaping.describe(ipr, "eth0")
            with namespaces.iproute(self.switch_ns) as ipr:
                out[f"{self.switch_ns}/{node.switch_port}"] = shaping.describe(ipr, node.switch_port)
        return out


def create_switch(name_prefix: str, record: Record) -> tuple[str, str]:
    """The switch namespace and its bridge; returns (namespace, bridge name)."""
    switch_ns, bridge = f"{name_prefix}-sw", f"{name_prefix}-br"
    record("netns", name=switch_ns)
    namespaces.create(switch_ns)
    record("link", name=bridge, netns=switch_ns)
    with namespaces.iproute(switch_ns) as ipr:
        ipr.link("add", ifname=bridge, kind="bridge")
        ipr.link("set", index=ipr.link_lookup(ifname=bridge)[0], state="up")
        _lo_up(ipr)
    return switch_ns, bridge


def add_node(switch_ns: str, bridge: str, name_prefix: str, rank: int, address: str, prefixlen: int,
             uplink: shaping.Shape, downlink: shaping.Shape, record: Record) -> NodePort:
    """One node namespace with ``eth0`` bridged to the switch, both directions shaped."""
    node_ns, port, temp = f"{name_prefix}-n{rank}", f"{name_prefix}-s{rank}", f"{name_prefix}-n{rank}"
    record("netns", name=node_ns)
    namespaces.create(node_ns)
    record("link", name="eth0", netns=node_ns, peer=port, peer_netns=switch_ns)
    with namespaces.iproute(None) as ipr:
        ipr.link("add", ifname=temp, kind="veth", net_ns_fd=node_ns, peer={"ifname": port, "net_ns_fd": switch_ns})
    with namespaces.iproute(node_ns) as ipr:
        index = ipr.link_lookup(ifname=temp)[0]
        ipr.link("set", index=index, ifname="eth0")
        ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
        ipr.link("set", index=index, state="up")
        _lo_up(ipr)
        record("qdisc", dev="eth0", netns=node_ns)
        shaping.apply(ipr, "eth0", uplink)
    with namespaces.iproute(switch_ns) as ipr:
        index = ipr.link_lookup(ifname=port)[0]
        ipr.link("set", index=index, master=ipr.link_lookup(ifname=bridge)[0], state="up")
        record("qdisc", dev=port, netns=switch_ns)
        shaping.apply(ipr, port, downlink)
    return NodePort(rank=rank, netns=node_ns, address=address, switch_port=port)


def build(name_prefix: str, subnet: str, nodes: int, uplink: shaping.Shape, downlink: shaping.Shape,
          record: Record) -> Star:
    """Create the whole star; every object goes through ``record`` before it exists."""
    net = ipaddress.ip_network(subnet)
    switch_ns, bridge = create_switch(name_prefix, record)
    if (uplink.delay_s or downlink.delay_s) and not probe.qdisc_available(switch_ns, "netem", record):
        raise UserError("--latency needs the netem qdisc, which this kernel lacks (no sch_netem): "
                        "run with --latency 0 or on a kernel with netem.")
    ports = [add_node(switch_ns, bridge, name_prefix, rank, str(net[rank + 1]), net.prefixlen, uplink, downlink, record)
             for rank in range(nodes)]
    return Star(switch_ns=switch_ns, bridge=bridge, prefixlen=net.prefixlen, nodes=ports)


def _lo_up(ipr) -> None:
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
