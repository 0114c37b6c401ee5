"""A TopologySpec made real: switch namespaces with bridges, node namespaces, shaped cables.

Every switch is a namespace of its own holding a bridge (not the host's namespace: a running
dockerd makes host bridges drop forwarded traffic). A node's cable runs from its ``eth0`` to a
port of its switch's bridge; trunks join bridges. All nodes share one flat /24, so any node
reaches any other through the cables of the path between them, each direction shaped on the
egress it leaves by.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from dataclasses import dataclass, field
from typing import Callable

from ..spec import TopologySpec, UserError
from . import cable, delayline, namespaces, probe, shaping

Record = Callable[..., None]
NUD_PERMANENT = 0x80         # a neighbour entry that never expires and is never resolved again


@dataclass
class NodePort:
    rank: int
    netns: str
    address: str
    switch_ns: str
    port: str


TCP_BUFFER_FLOOR = 6 << 20      # never below Linux's usual autotuning maximum
GSO_TIME_S = 0.001              # a node's GSO packet is at most this much of its slowest path's time (gso_segments)
GSO_MAX_SEGS = 65535            # the kernel's own limit, every device's default
# Every node's TCP congestion control: Linux's default, what a cluster's hosts run unless tuned. A new
# namespace inherits the host's choice instead, and a host set to BBR (this project's VMs are) gives
# the nodes a congestion control that paces by its own clock, in host time: under --dilate 4 it left
# a link-bound replay 12-16 % slower than undilated, where cubic's was within 2 % (docs/replay.md).
TCP_CONGESTION_CONTROL = "cubic"


def tcp_buffer_bytes(topo: TopologySpec, rank: int) -> int:
    """Socket buffer limit for a node: 4 x the largest bandwidth-delay product of its paths.

    A TCP sender keeps at most its send buffer in flight, so a stock 4 MB limit caps a 1 Gbit/s
    stream at ~600 Mbit/s once the RTT reaches 40 ms; hosts on such links are tuned, and so are
    our nodes (the values are recorded with the run).
    """
    bdp = 0.0
    for other in range(len(topo.nodes)):
        if other != rank:
            out, back = topo.path(rank, other), topo.path(other, rank)
            rtt = sum(d.delay_s + d.jitter_s for d in out + back)
            bdp = max(bdp, min(d.rate_bps for d in out) / 8 * rtt)
    return max(TCP_BUFFER_FLOOR, int(4 * bdp))


def gso_segments(topo: TopologySpec, rank: int) -> int:
    """How many segments node ``rank``'s TCP may hand its interface in one GSO packet: what the
    slowest egress on any of its paths carries in GSO_TIME_S, at least one.

    An htb lets a GSO packet through at once and then holds its class in debt for the time the
    packet is worth at its rate, so a short message behind it, from any node, waits out the debt:
    64 KB are 52 ms at 10 Mbit/s (by hand, a node's ACKs waited 26-31 ms on average, against 0.7-2.3
    with one segment a packet; docs/replay.md, "One frame at a time"). A real switch's port takes a
    host's frames one at a time and interleaves other hosts' with them. Linux gives a flow whose
    minimum RTT is under about 0.5 ms (no delay on the links) 64 KB packets at any rate
    (tcp_tso_autosize's RTT term, 64 KB >> (min RTT / 512 us), beside about 1 ms of its pacing
    rate). Fewer segments cost the host CPU (one a packet at 1gbit with 5 ms of delay line read
    771-905 Mbit/s, GSO packets 915-1004), so a node whose paths are all fast keeps them; the limit
    is the interface's, so one slow path sets it for all of the node's traffic. A connection keeps
    the size it was given when it connected: a kept network's re-shape reaches the next run's
    connections.
    """
    rates = [d.rate_bps for other in range(len(topo.nodes)) if other != rank for d in topo.path(rank, other)]
    slowest = min(rates, default=topo.nodes[rank].hop.ab.rate_bps)
    return max(1, min(GSO_MAX_SEGS, int(slowest / 8 * GSO_TIME_S // shaping.FRAME_BYTES)))


@dataclass
class Network:
    prefix: str
    impl: str
    tcp_buffers: dict[str, int]
    switches: dict[str, str]               # switch name -> namespace
    nodes: list[NodePort]
    cables: list[cable.Cable] = field(default_factory=list)
    relay: subprocess.Popen | None = None
    allowed_on_host: bool = False          # this build added TCP_CONGESTION_CONTROL to the host's allowed list
    gso_max_segs: dict[str, int] = field(default_factory=dict)   # node namespace -> its eth0's, as the kernel reads it
    # namespace -> its receive steering mask as read back, None where the kernel has no such setting
    # per namespace; empty where the cables are the delay line's TAPs (keep_flows_in_order)
    rps_default_mask: dict[str, str | None] = field(default_factory=dict)

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
        """Stop the delay line and return its counters by direction of each cable."""
        return delayline.stop(self.relay) if self.relay else {}


def choose_impl(requested: str, topo: TopologySpec, probe_ns: str, record: Record, loss_later: bool = False) -> str:
    """How delay, jitter and loss are made: the delay line when asked for by name (even with
    nothing to delay, to measure the line itself), else ``none`` when no hop needs them (now or,
    ``loss_later``, from a loss fault mid-run), else netem or the delay line (``auto`` prefers
    netem, probed on a scratch link)."""
    if requested == "delayline":
        return "delayline"
    hops = _hops(topo)
    if not loss_later and not any(cable.impaired(d) for h in hops for d in (h.ab, h.ba)):
        return "none"
    has_netem = probe.qdisc_available(probe_ns, "netem", record)
    if requested == "netem" and not has_netem:
        raise UserError("--latency-impl netem was asked for but this kernel has no netem qdisc (sch_netem): "
                        "use --latency-impl auto or delayline.")
    return "netem" if has_netem else "delayline"


def build(prefix: str, subnet: str, topo: TopologySpec, latency_impl: str, seed: int, record: Record,
          adopt: dict[int, int] | None = None, lossy: frozenset[int] = frozenset()) -> Network:
    """Create everything; each object goes through ``record`` before it exists. ``adopt`` maps a
    rank to the pid of a process (a container's) whose network namespace becomes that node's,
    instead of a new one; ``lossy`` are the ranks whose cable a loss fault may strike."""
    net = ipaddress.ip_network(subnet)
    switches = {}
    for i, name in enumerate(topo.switches):
        ns = f"{prefix}-sw{i}"
        record("netns", name=ns, switch=name)
        namespaces.create(ns)
        _quiet_ipv6(ns)
        with namespaces.iproute(ns) as ipr:
            record("link", name=f"{prefix}-br", netns=ns)
            ipr.link("add", ifname=f"{prefix}-br", kind="bridge")
            ipr.link("set", index=ipr.link_lookup(ifname=f"{prefix}-br")[0], state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        switches[name] = ns
    impl = choose_impl(latency_impl, topo, next(iter(switches.values())), record, loss_later=bool(lossy))
    network = Network(prefix=prefix, impl=impl, tcp_buffers={}, switches=switches, nodes=[])
    steered = impl != "delayline"
    if steered:
        for ns in switches.values():            # before their ports exist
            network.rps_default_mask[ns] = keep_flows_in_order(ns)
    for rank, attach in enumerate(topo.nodes):
        node_ns = f"{prefix}-n{rank}"
        record("netns", name=node_ns)
        if adopt:
            namespaces.attach(node_ns, adopt[rank])
        else:
            namespaces.create(node_ns)
        _quiet_ipv6(node_ns)
        if steered:
            network.rps_default_mask[node_ns] = keep_flows_in_order(node_ns)
        network.cables.append(cable.Cable(node_ns, "eth0", switches[attach.switch], f"{prefix}-p{rank}", attach.hop,
                                          lossy=rank in lossy, a_host=True))
    for j, trunk in enumerate(topo.trunks):
        network.cables.append(cable.Cable(switches[trunk.a], f"{prefix}-t{j}a", switches[trunk.b], f"{prefix}-t{j}b",
                                          trunk.hop))
    if impl == "delayline":
        for c in network.cables:
            record("link", name=c.a_if, netns=c.a_ns, peer=c.b_if, peer_netns=c.b_ns)
        network.relay = delayline.start(network.cables, seed, record)
    else:
        for c in network.cables:
            cable.create_veth(c, record)
    for c in network.cables:
        cable.shape(c, impl, record)
    for rank, c in enumerate(network.cables[:len(topo.nodes)]):
        address = str(net[rank + 1])
        with namespaces.iproute(c.a_ns) as ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            ipr.addr("add", index=index, address=address, prefixlen=net.prefixlen)
            ipr.link("set", index=index, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        _tune_tcp(network, c.a_ns, tcp_buffer_bytes(topo, rank))
        _limit_gso(network, c.a_ns, gso_segments(topo, rank))
        network.nodes.append(NodePort(rank, c.a_ns, address, c.b_ns, c.b_if))
    for c in network.cables[len(topo.nodes):]:
        _bridge(c.a_ns, prefix, c.a_if)
    for c in network.cables:
        _bridge(c.b_ns, prefix, c.b_if)
    _static_neighbours(network)
    return network


def _static_neighbours(network: Network) -> None:
    """Every node knows every other node's MAC from the start. With ARP, 64 nodes opening Gloo's
    full mesh at once sent 4,032 broadcasts through the shaped switch, resolutions went
    unanswered and connects failed with "No route to host"; nodes on one switch have no reason
    to ask, and the links carry only the job's bytes."""
    macs, index = {}, {}
    for port in network.nodes:
        with namespaces.iproute(port.netns) as ipr:
            index[port.rank] = ipr.link_lookup(ifname="eth0")[0]
            macs[port.rank] = ipr.get_links(index[port.rank])[0].get_attr("IFLA_ADDRESS")
    for port in network.nodes:
        with namespaces.iproute(port.netns) as ipr:
            for other in network.nodes:
                if other.rank != port.rank:
                    ipr.neigh("add", dst=other.address, lladdr=macs[other.rank], ifindex=index[port.rank],
                              state=NUD_PERMANENT)


def fits(network: Network, topo: TopologySpec, latency_impl: str, lossy: frozenset[int] = frozenset()) -> bool:
    """Whether ``reshape`` can give ``network`` (built with the same ``latency_impl``) the links
    of ``topo``: the same switches, nodes and trunks, delay made by the same means or, in both, not
    at all, and each cable's packets as they were (offloads and netem leaves are settled when a
    cable is made)."""
    hops = _hops(topo)
    if list(network.switches) != topo.switches or len(hops) != len(network.cables) or \
            [n.switch for n in topo.nodes] != [network_switch(network, p) for p in network.nodes]:
        return False
    undelayed = latency_impl != "delayline" and not lossy and not any(cable.impaired(d) for h in hops for d in (h.ab, h.ba))
    if undelayed != (network.impl == "none"):
        return False
    for i, (c, hop) in enumerate(zip(network.cables, hops)):
        if (c.lossy, _unsegmented(c.hop)) != (i in lossy, _unsegmented(hop)) or \
                network.impl == "netem" and _leaves(c.hop) != _leaves(hop):
            return False
    for (c, trunk) in zip(network.cables[len(topo.nodes):], topo.trunks):
        if (network.switches[trunk.a], network.switches[trunk.b]) != (c.a_ns, c.b_ns):
            return False
    return True


def network_switch(network: Network, port: NodePort) -> str:
    """The name (in its topology) of the switch node ``port`` hangs on."""
    return next(name for name, ns in network.switches.items() if ns == port.switch_ns)


def reshape(network: Network, topo: TopologySpec, seed: int) -> None:
    """Give a built network the links of ``topo`` in place (it ``fits``): every egress's htb class
    and netem leaf changed, the delay line retuned and its generators restarted from ``seed`` (the
    delays drawn from now on are those of a network built now with ``seed``), the nodes' TCP buffers
    sized anew. What the kernel holds stays: namespaces, devices, addresses, neighbour tables,
    qdisc counters."""
    network.allowed_on_host = False        # a later cell changed the host only if its own tuning did
    hops = _hops(topo)
    for i, (c, hop) in enumerate(zip(network.cables, hops)):
        c.hop = hop
        for ns, ifname, d in ((c.a_ns, c.a_if, hop.ab), (c.b_ns, c.b_if, hop.ba)):
            with namespaces.iproute(ns) as ipr:
                shaping.change(ipr, ifname, d, netem=network.impl == "netem" and (c.lossy or cable.impaired(d)))
        if network.relay:
            delayline.retune(network.relay, i, "ab", hop.ab)
            delayline.retune(network.relay, i, "ba", hop.ba)
    if network.relay:
        delayline.reseed(network.relay, seed)
    for port in network.nodes:
        _tune_tcp(network, port.netns, tcp_buffer_bytes(topo, port.rank))
        _limit_gso(network, port.netns, gso_segments(topo, port.rank))


def _tune_tcp(network: Network, ns: str, limit: int) -> None:
    """Let a node's sockets hold ``limit`` bytes (tcp_buffer_bytes) and give them Linux's default
    congestion control (TCP_CONGESTION_CONTROL), and remember both for the run's record."""
    namespaces.write_sysctl(ns, "net/ipv4/tcp_wmem", f"4096 16384 {limit}")
    namespaces.write_sysctl(ns, "net/ipv4/tcp_rmem", f"4096 131072 {limit}")
    try:
        try:
            namespaces.write_sysctl(ns, "net/ipv4/tcp_congestion_control", TCP_CONGESTION_CONTROL)
        except PermissionError:
            if not _allow_congestion_control(TCP_CONGESTION_CONTROL):
                raise
            network.allowed_on_host = True
            namespaces.write_sysctl(ns, "net/ipv4/tcp_congestion_control", TCP_CONGESTION_CONTROL)
    except OSError as e:
        raise RuntimeError(f"this kernel cannot give the nodes TCP congestion control {TCP_CONGESTION_CONTROL} "
                           f"({e.strerror or e}): its module may be missing (modprobe tcp_{TCP_CONGESTION_CONTROL}), "
                           "the host may not allow it (net.ipv4.tcp_allowed_congestion_control), or the kernel may "
                           "be older than 4.15, which sets it for every namespace at once.") from None
    network.tcp_buffers[ns] = limit


def _limit_gso(network: Network, ns: str, segments: int) -> None:
    """Give node ``ns``'s eth0 GSO packets of ``segments`` at most, and remember what the kernel
    then reports, for the run's record."""
    with namespaces.iproute(ns) as ipr:
        index = ipr.link_lookup(ifname="eth0")[0]
        ipr.link("set", index=index, gso_max_segs=segments)
        network.gso_max_segs[ns] = ipr.get_links(index)[0].get_attr("IFLA_GSO_MAX_SEGS")


ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def _allow_congestion_control(name: str) -> bool:
    """Add ``name`` to the host's allowed congestion controls, True if it was missing. A namespace
    other than the host's may only take an allowed one as its default, and a host whose own
    default is BBR may allow only reno and bbr (these VMs since 26 November 2026). Allowing cubic
    changes no socket's choice; it stays allowed after the run, as other hosts have it."""
    with open(ALLOWED_CC) as f:
        allowed = f.read().split()
    if name in allowed:
        return False
    with open(ALLOWED_CC, "w") as f:
        f.write(" ".join([*allowed, name]))
    return True


def _hops(topo: TopologySpec) -> list:
    """Every cable's hop in the order ``build`` makes the cables: the nodes' by rank, then the trunks."""
    return [n.hop for n in topo.nodes] + [t.hop for t in topo.trunks]


def _unsegmented(hop) -> bool:
    """A cable with loss runs with offloads off (see delayline)."""
    return bool(hop.ab.loss_pct or hop.ba.loss_pct)


def _leaves(hop) -> tuple[bool, bool]:
    """Which directions have a netem leaf (``apply`` adds one only where there is something to do)."""
    return cable.impaired(hop.ab), cable.impaired(hop.ba)


def cpu_mask(cpus: set[int]) -> str:
    """A mask of the cores numbered ``cpus`` as the kernel's bitmaps are written: hex in groups of
    32 bits joined by commas, the highest first."""
    bits = sum(1 << c for c in cpus)
    groups = []
    while True:
        groups.append(f"{bits & 0xFFFFFFFF:x}" if bits >> 32 == 0 else f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            return ",".join(reversed(groups))


def keep_flows_in_order(ns: str) -> str | None:
    """Have the devices made later in namespace ``ns`` hand what they receive to a core chosen by
    the packet's flow (receive packet steering over every core); the mask as the kernel reads it
    back, or None where it has no such setting per namespace (it came in Linux 6.3). A veth queues
    each packet it carries on the backlog of the core that sent it, and with a qdisc that either
    core may run, one flow's packets landed on both cores' backlogs, which drain in either order:
    the flow arrived reordered, as no switch reorders one, and TCP retransmitted what it took for
    lost (Gloo's ring at 8 nodes: 3-12 of 16 calls a run, up to 560 spurious retransmissions a run,
    calls down to 0.67 of the link; docs/replay.md, "One flow in order"). The delay line's TAPs
    need none: its relay's one thread hands them every frame in order, straight to the stack."""
    key = "net/core/rps_default_mask"
    try:
        namespaces.write_sysctl(ns, key, cpu_mask(os.sched_getaffinity(0)))     # the cores this host lets us use
    except FileNotFoundError:
        return None
    return namespaces.read_sysctl(ns, key)


def _quiet_ipv6(ns: str) -> None:
    """IPv6 autoconfiguration chatter (DAD, router solicitations, MLD) would cross the shaped
    links and the byte counters; the testbed speaks IPv4 only."""
    try:
        namespaces.write_sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1")
    except FileNotFoundError:
        pass                                  # a kernel without IPv6 has nothing to quiet


def _bridge(ns: str, prefix: str, ifname: str) -> None:
    with namespaces.iproute(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, master=ipr.link_lookup(ifname=f"{prefix}-br")[0], state="up")
