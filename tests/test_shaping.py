"""The shaper really limits: TCP between two node namespaces runs at the configured rate."""

from __future__ import annotations

import concurrent.futures
import math
import os
import socket
import struct
import subprocess
import sys
import time
import warnings

import pytest
from pyroute2 import netns

from gctestbed.launch.network import Shaped
from gctestbed.net import measure, namespaces, shaping, topology
from gctestbed.spec import Direction, Hop, LinkSpec, NodeAttach, RunSpec, TopologySpec, Trunk

pytestmark = pytest.mark.root


def build(ledger, topo, impl="auto"):
    return topology.build(f"gct-{ledger.run_id}", ledger.subnet, topo, impl, 0, ledger.add)


def test_burst_is_a_few_ms_and_at_least_two_frames():
    assert shaping.burst_bytes(1_000_000) == 2 * shaping.FRAME_BYTES
    assert shaping.burst_bytes(1_000_000_000) == 250_000          # 2 ms at 1 gbit
    assert shaping.burst_bytes(100_000_000_000) == 25_000_000     # 64-bit rates keep scaling


@pytest.mark.parametrize("rate_bps", [50_000_000, 200_000_000])
def test_tcp_throughput_matches_configured_rate(ledger, rate_bps):
    net = build(ledger, TopologySpec.star(2, LinkSpec(bw_bps=rate_bps)))
    a, b = net.nodes
    measured = measure.throughput_bps(b.netns, b.address, a.netns, seconds=3)
    assert abs(measured - rate_bps) / rate_bps < 0.10, f"{measured / 1e6:.1f} Mbit/s through a {rate_bps / 1e6:g} Mbit/s link"


def test_applied_configuration_is_read_back_from_the_kernel(ledger):
    net = build(ledger, TopologySpec.star(1, LinkSpec(bw_bps=10_000_000_000)))
    applied = net.describe()
    node = net.nodes[0]
    assert set(applied) == {f"{node.netns}/eth0", f"{node.switch_ns}/{node.port}"}
    for config in applied.values():
        assert [q["kind"] for q in config["qdiscs"]][0] == "htb"
        cls = shaping.link_class(config)
        assert cls["rate_bps"] == cls["ceil_bps"] == 10_000_000_000
        assert abs(cls["burst_bytes"] - shaping.burst_bytes(10_000_000_000)) / shaping.burst_bytes(10_000_000_000) < 0.02
    # the node's egress splits the link's class in two (pure ACKs first), the switch's port does not
    node_classes = {c["classid"]: c for c in applied[f"{node.netns}/eth0"]["classes"]}
    assert set(node_classes) == {"1:1", "1:2", "1:3"}
    assert node_classes["1:2"]["rate_bps"] + node_classes["1:3"]["rate_bps"] <= 10_000_000_000
    assert node_classes["1:2"]["ceil_bps"] == node_classes["1:3"]["ceil_bps"] == 10_000_000_000
    assert [c["classid"] for c in applied[f"{node.switch_ns}/{node.port}"]["classes"]] == ["1:1"]


def _gso_max_segs(ns: str) -> int:
    with namespaces.iproute(ns) as ipr:
        return ipr.get_links(ipr.link_lookup(ifname="eth0")[0])[0].get_attr("IFLA_GSO_MAX_SEGS")


def test_a_nodes_gso_packets_are_a_millisecond_of_its_link_at_most(ledger):
    """A node's interface takes GSO packets of what its slowest path carries in 1 ms, at least one
    segment (topology.gso_segments), as the kernel reports it and the run's record keeps it, built
    and re-shaped in place. By hand, full frames of 1514 bytes: 10 Mbit/s carry 1,250 bytes in 1
    ms, less than a frame: 1; 100 Mbit/s 12,500 bytes: 8; 1 Gbit/s 125,000 bytes: 82."""
    net = build(ledger, TopologySpec.star(2, LinkSpec(bw_bps=10_000_000)))
    assert [_gso_max_segs(n.netns) for n in net.nodes] == [1, 1] and net.gso_max_segs == {n.netns: 1 for n in net.nodes}
    for rate, segs in ((100_000_000, 8), (1_000_000_000, 82)):
        topology.reshape(net, TopologySpec.star(2, LinkSpec(bw_bps=rate)), 0)
        assert [_gso_max_segs(n.netns) for n in net.nodes] == [segs, segs]
        assert net.gso_max_segs == {n.netns: segs for n in net.nodes}


def test_a_nodes_gso_packets_are_sized_by_the_slowest_egress_on_its_paths():
    """Not only its own uplink: a packet crosses the other node's downlink and the trunks, each an
    htb that a GSO packet puts in debt. By hand: 1 Gbit/s up and 10 Mbit/s down, every path crosses
    a 10 Mbit/s downlink: 1 segment; two 1 Gbit/s racks joined by a 100 Mbit/s trunk, with one
    or two nodes each (every node has a peer across it): 8; one node alone, its uplink: 82."""
    assert topology.gso_segments(TopologySpec.star(2, LinkSpec(bw_bps=10**9, bw_down_bps=10**7)), 0) == 1
    fast, slow = Hop(Direction(10**9), Direction(10**9)), Hop(Direction(10**8), Direction(10**8))
    racks = TopologySpec(name="racks", nodes=[NodeAttach("r0", fast), NodeAttach("r1", fast)], trunks=[Trunk("r0", "r1", slow)])
    assert [topology.gso_segments(racks, r) for r in (0, 1)] == [8, 8]
    rack = TopologySpec(name="rack", nodes=[NodeAttach("r0", fast)] * 2 + [NodeAttach("r1", fast)], trunks=[Trunk("r0", "r1", slow)])
    assert [topology.gso_segments(rack, r) for r in (0, 1, 2)] == [8, 8, 8]
    assert topology.gso_segments(TopologySpec.star(1, LinkSpec(bw_bps=10**9)), 0) == 82


def _sender(ns: str, addr: str, port: int) -> socket.socket:
    s = netns.create_socket(ns, socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.connect((addr, port))
    return s


def _srtt_ms(s: socket.socket) -> float:
    """The kernel's smoothed round trip of a socket (struct tcp_info's tcpi_rtt, in microseconds)."""
    return struct.unpack_from("I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 68)[0] / 1e3


def _tcp_counters(ns: str) -> dict:
    """The namespace's TCP counters, as the kernel keeps them (/proc/net/snmp and netstat)."""
    out = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            if names.startswith(("Tcp:", "TcpExt:")):
                out.update(zip(names.split()[1:], map(int, values.split()[1:])))
    return out


def test_a_nodes_acks_go_ahead_of_the_data_it_sends(ledger):
    """Linux hosts' default qdisc (fq_codel) serves a sparse flow, such as a host's pure ACKs, ahead
    of bulk data, so a node's ACKs do not wait behind its own outgoing data (shaping's docstring).
    Checked by the kernel's own round trip of a flow whose ACKs leave by a loaded egress: node a
    sends bulk TCP to b through 10 Mbit/s links while b, on a connection of its own, sends a's sink
    2 KB every 20 ms (far below the link: no queue of its own); a's ACKs to b share a's egress and
    the switch's port to b with a's data to b. b's smoothed RTT stays under 10 ms (0.7-2.3 measured,
    once 7.5 on a busy host). Planted: a node's TCP handing its interface 64 KB GSO packets
    (topology._limit_gso left out), 26.2-30.8 ms, the switch's port to b in debt after each; the
    ACKs' filters sending them to the bulk class, 4.7-4.9 ms, which the class counters catch (the
    bulk went through the bulk class at the link's rate, and the ACKs through theirs)."""
    net = build(ledger, TopologySpec.star(2, LinkSpec(bw_bps=10_000_000)))
    a, b = net.nodes
    sink = measure.Sink(a.netns, a.address, 0, 5301)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        bulk = pool.submit(measure.throughput_bps, b.netns, b.address, a.netns, 4)     # a sends to b
        time.sleep(1.5)                                                                  # a's queue built
        with _sender(b.netns, a.address, 5301) as s:
            for _ in range(100):
                s.sendall(b"x" * 2000)
                time.sleep(0.02)
            srtt = _srtt_ms(s)
        goodput = bulk.result()
    sink.close()
    assert goodput > 0.90 * 10e6, f"{goodput / 1e6:.2f} Mbit/s of bulk data through a 10 Mbit/s link"
    assert srtt < 10, f"b's smoothed round trip {srtt:.1f} ms, its ACKs from a behind a's bulk data to b"
    with namespaces.iproute(a.netns) as ipr:
        classes = {x["classid"]: x for x in shaping.describe(ipr, "eth0")["classes"]}
    assert classes["1:1"]["overlimits"] > 0                                # a's egress, not the switch's, held the rate
    assert classes["1:3"]["sent_bytes"] > 0.9 * goodput / 8 * 4 > 0        # the bulk, in the bulk class
    assert classes["1:2"]["sent_packets"] > 50 and classes["1:2"]["sent_bytes"] < classes["1:2"]["sent_packets"] * 128


def test_a_nodes_short_answers_wait_for_a_few_frames_of_its_data_elsewhere_at_most(ledger):
    """What Gloo's ring needs of a node's egress (docs/replay.md, "Small packets behind bulk data"):
    its short messages to one peer wait behind a few frames of its bulk data to another at most, as
    on a host whose TCP keeps a few frames in its qdisc. Node a sends bulk TCP to b through 10
    Mbit/s links while c asks a's echo server 40 bytes at a time, every 20 ms, each answered with 40
    bytes of data (PSH set: not a pure ACK, so it queues with a's data), for 2.5 s while a sends.
    The median question and answer, timed by c, stays under 15 ms (4.2-5.4 measured: some 4.5 KB
    of a's data ahead of it).
    Planted: a node's TCP handing its interface 64 KB GSO packets (topology._limit_gso left out),
    whose queue at a's egress held 136 KB in two of them: 143.4 ms."""
    net = build(ledger, TopologySpec.star(3, LinkSpec(bw_bps=10_000_000)))
    a, b, c = net.nodes
    server = netns.create_socket(a.netns, socket.AF_INET, socket.SOCK_STREAM)
    server.bind((a.address, 5303))
    server.listen(1)
    server.settimeout(20)

    def echo():
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(40):
                conn.sendall(data)

    times = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        echoed = pool.submit(echo)
        bulk = pool.submit(measure.throughput_bps, b.netns, b.address, a.netns, 5)     # a sends to b
        time.sleep(1.5)                                                                  # a's queue built
        with _sender(c.netns, a.address, 5303) as s:
            end = time.perf_counter() + 2.5                                              # while a still sends
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                s.sendall(b"q" * 40)
                got = b""
                while len(got) < 40:
                    got += s.recv(40 - len(got))
                times.append(time.perf_counter() - t0)
                time.sleep(0.02)
        echoed.result(timeout=20)
        goodput = bulk.result()
    server.close()
    median_ms = sorted(times)[len(times) // 2] * 1e3
    assert goodput > 0.90 * 10e6, f"{goodput / 1e6:.2f} Mbit/s of bulk data through a 10 Mbit/s link"
    assert median_ms < 15, f"c's median question and answer {median_ms:.1f} ms, a's answers behind its data to b"


def test_a_small_write_does_not_overtake_its_own_connections_data(ledger):
    """Only pure ACKs go first: a small data segment sent ahead of its own connection's queued data
    would arrive out of order, which fq_codel, one queue a flow, never does. A sender writes 100 kB,
    then 40 bytes 5 ms later, then waits 0.1 s, for 5 s through a 10 Mbit/s link; the kernel's
    counters of reordering on its side stay at zero and of retransmission at two at most
    (planted, packets under 128 bytes matched by size alone, as a first version did: 47
    reorderings and 45 retransmitted segments)."""
    net = build(ledger, TopologySpec.star(2, LinkSpec(bw_bps=10_000_000)))
    a, b = net.nodes
    sink = measure.Sink(b.netns, b.address, 0, 5302)
    before = _tcp_counters(a.netns)
    with _sender(a.netns, b.address, 5302) as s:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            s.sendall(b"x" * 100_000)          # 80 ms of the link
            time.sleep(0.005)
            s.sendall(b"y" * 40)
            time.sleep(0.1)
    sink.close()
    after = _tcp_counters(a.netns)
    moved = {k: after[k] - before[k] for k in ("TCPSACKReorder", "TCPTSReorder", "TCPRenoReorder", "RetransSegs",
                                               "TCPDSACKRecv") if k in after}
    # no reordering at all; a retransmission or two allowed: CI once saw one, with one DSACK, TCP's own tail-loss
    # probe sent early and found a duplicate (a version that reordered: 47 reorderings, 45 retransmitted segments)
    reorder = {k: v for k, v in moved.items() if "Reorder" in k}
    assert reorder and not any(reorder.values()) and moved["RetransSegs"] <= 2, moved


def _rps_cpus(ns: str) -> dict[str, int]:
    """Every cable end's receive steering mask in namespace ``ns`` (rx-0's rps_cpus), as sysfs
    mounted there reads it: loopback and the switch's bridge (made before the mask; it forwards
    without a backlog of its own) aside."""
    out = subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                          "for f in /sys/class/net/*/queues/rx-0/rps_cpus; do echo $f $(cat $f); done"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return {line.split("/")[4]: int(line.split()[1].replace(",", ""), 16) for line in out
            if line and line.split("/")[4] != "lo" and not line.split("/")[4].endswith("-br")}


@pytest.mark.rps
def test_a_flow_arrives_in_order_however_the_host_cores_share_the_nodes(ledger):
    """A switch never reorders a flow; two cores handing veth packets to their own backlogs did
    (topology.keep_flows_in_order). Every device of the nodes and the switch steers what it
    receives by flow over every core (its rps_cpus, read from sysfs in its namespace, and the
    run's record), and a ring of 8 flows through 10 Mbit/s links, each written 130 kB every 50 ms
    for 8 s (20.8 Mbit/s offered: the flow stays backlogged), arrives with no segment out of
    order, by the kernel's counters on both ends (receivers' out-of-order queue, senders'
    reordering counts). Planted, the steering left out (and its masks unchecked): 1, 3 and 108
    segments out of order in 3 runs of 4 (measure.throughput_bps's flows instead: 1 run of 3,
    why they differ not worked out)."""
    net = build(ledger, TopologySpec.star(8, LinkSpec(bw_bps=10_000_000)))
    spaces = [n.netns for n in net.nodes] + list(net.switches.values())
    every = sum(1 << c for c in os.sched_getaffinity(0))
    masks = {ns: _rps_cpus(ns) for ns in spaces}
    assert all(m and set(m.values()) == {every} for m in masks.values()), masks
    assert {ns: int(v.replace(",", ""), 16) for ns, v in net.rps_default_mask.items()} == dict.fromkeys(spaces, every)
    keys = ("TCPOFOQueue", "TCPSACKReorder", "TCPTSReorder", "TCPRenoReorder", "TCPDSACKRecv")
    before = {n.netns: _tcp_counters(n.netns) for n in net.nodes}
    nodes = net.nodes

    def bursts(i: int) -> float:
        """Node i writes node i+1 130 kB, waits 50 ms, again, for 8 s: the goodput."""
        peer = nodes[(i + 1) % len(nodes)]
        sink = measure.Sink(peer.netns, peer.address, 0, 5310)
        with _sender(nodes[i].netns, peer.address, 5310) as s:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                s.sendall(b"x" * 130_000)
                time.sleep(0.05)
        return sink.goodput_bps()
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        goodput = list(pool.map(bursts, range(len(nodes))))
    moved = {k: sum(_tcp_counters(ns)[k] - c[k] for ns, c in before.items()) for k in keys if k in before[nodes[0].netns]}
    assert min(goodput) > 0.6 * 10e6, [round(g / 1e6, 2) for g in goodput]
    assert moved["TCPOFOQueue"] == 0 and not any(v for k, v in moved.items() if "Reorder" in k), moved


def test_a_delay_lines_taps_are_left_unsteered(ledger):
    """The delay line's relay hands its TAP devices every frame from one thread, in order, and a
    TAP passes it to the stack in that thread: nothing to reorder, and steering would only add a
    hop to another core per frame. So its namespaces are not steered, nor recorded as steered
    (planted: steered like veths -> every mask 3 on this 2-core host)."""
    net = build(ledger, TopologySpec.star(2, LinkSpec(bw_bps=10_000_000, latency_s=0.001)), impl="delayline")
    masks = {ns: _rps_cpus(ns) for ns in [n.netns for n in net.nodes] + list(net.switches.values())}
    assert all(m and set(m.values()) == {0} for m in masks.values()), masks
    assert net.rps_default_mask == {}


def test_nodes_run_linux_default_congestion_control_whatever_the_hosts(ledger):
    """A namespace inherits the host's congestion control; a host set to BBR (these VMs are) gave the
    nodes BBR, which paces by its own clock and left dilated replays 12-16 % slow (docs/replay.md).
    The host is set to reno here, so a node that kept the inherited one fails; and cubic is taken
    off the host's allowed list (these VMs allowed only reno and bbr from 26 November 2026), where
    a namespace may not take it as its default until the host allows it."""
    keys = ["/proc/sys/net/ipv4/tcp_congestion_control", topology.ALLOWED_CC]
    host = []
    for key in keys:
        with open(key) as f:
            host.append(f.read().strip())
    try:
        for key, value in zip(keys, ["reno", "reno"]):
            with open(key, "w") as f:
                f.write(value)
        shaped = Shaped(RunSpec(nodes=2, link=LinkSpec(bw_bps=100_000_000)), ledger)   # as netns and docker build it
        shaped.build()
        net = shaped.network
        with open(topology.ALLOWED_CC) as f:
            assert f.read().split() == ["reno", "cubic"]
        # and the run's record (its shaping, as the store keeps it) says it changed the host
        assert shaped.describe()["tcp_congestion_control_allowed_on_host"] is True
    finally:
        for key, value in zip(keys, host):
            with open(key, "w") as f:
                f.write(value)
    probe = "import socket; s = socket.socket(); print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).strip(b'\\0').decode())"
    for node in net.nodes:
        # what a new socket in the node gets, as the kernel reports it
        got = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", probe],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert got == topology.TCP_CONGESTION_CONTROL == "cubic", got


@pytest.mark.iperf3      # the flow's window is read from calibrate's call of iperf3
def test_a_lossy_path_is_calibrated_against_what_tcp_carries_through_its_loss(ledger, monkeypatch):
    """Through 0.5 % loss at a 10 ms round trip one cubic flow carries some 20 Mbit/s of a 1 Gbit/s
    link (its Reno-friendly window, Mathis et al. 1997), so that is the path's target; a flow that
    reached the shaped rate would mean the loss was not applied. The node's congestion control
    matters: BBR ignores random loss and ran at the link's rate. The flow is timed until it should
    have met 50 losses: timed for 1.5 s (some 12), 3 of 16 such paths missed by more than 25 %."""
    from gctestbed.net import calibrate
    topo = TopologySpec.star(2, LinkSpec(bw_bps=1_000_000_000, latency_s=0.005, loss_pct=0.5))
    net = build(ledger, topo)
    windows = []
    flow = calibrate._iperf3
    monkeypatch.setattr(calibrate, "_iperf3", lambda a, b, seconds, warmup_s: windows.append(seconds) or flow(a, b, seconds, warmup_s))
    for p, window in zip(calibrate.calibrate(topo, net.nodes), windows, strict=True):
        # by hand: frames of 1514 bytes, 1.22 / sqrt(0.005) of them a round trip (cubic's own window is smaller here)
        mathis = 1514 * 8 * 1.22 / math.sqrt(0.005) / p.rtt_idle_s
        assert p.loss_limited and p.target_bps == pytest.approx(mathis, rel=0.01), (p.target_bps, mathis)
        # by hand: 50 losses at 0.5 % of mathis / 1514 / 8 frames a second (some 5.9 s)
        assert window == pytest.approx(50 / (mathis / (1514 * 8) * 0.005), rel=0.01), window
        assert p.wire_bps < 0.1 * 1_000_000_000, p.wire_bps          # the loss bites: far below the link
        # the rate held to it (its RTT is test_emulation's: in CI this path's idle RTT read 11.1 and 11.4 ms,
        # above the 10.25 ms it read under load and calibrate's 1 ms slack; not the relay's wake-up, measured
        # on 28 November, likely the host: shown as a warning, and a delay missing from one way still fails)
        assert abs(p.rate_error) <= calibrate.LOSS_TOLERANCE, (p.wire_bps, p.target_bps)
        assert abs(p.rtt_idle_s - 0.010) < 0.0025, p.rtt_idle_s
        if p.miss:
            warnings.warn(f"the lossy path's idle RTT missed calibrate's rule: {p.miss}")


def test_an_idle_rtt_lifted_by_a_hiccup_is_probed_again_and_a_wrong_delay_still_misses():
    """A burst of late probes (the host's hiccup) does not fail a path whose next 20 probes meet
    the target (the median of all 30 does); a path whose probes miss twice keeps the miss. Misses
    are judged within max(1 ms, 10 %) of the target."""
    from gctestbed.net import calibrate
    for batches, target, expected in [([[0.0125] * 10, [0.0101] * 20], 0.010, 0.0101),   # hiccup, then on target
                                      ([[0.0125] * 10, [0.0124] * 20], 0.010, 0.0124),   # a delay 2.4 ms long, twice
                                      ([[0.0125] * 10, [0.0101] * 10 + [0.0125] * 10], 0.010, 0.0125),   # late for longer:
                                      # the median of all 30, not of the last 20 (0.0113, within the slack)
                                      ([[0.0103] * 10], 0.010, 0.0103),                  # on target the first time
                                      ([[0.0325] * 10], 0.030, 0.0325)]:                 # 2.5 ms off, within 10 % of 30 ms
        calls = iter(batches)
        asked = []

        def probe(n):
            asked.append(n)
            batch = next(calls)
            assert len(batch) == n
            return batch
        assert calibrate.idle_rtt(probe, target) == expected
        assert asked == [len(b) for b in batches]                    # no probe more than needed
    assert calibrate.rtt_misses(0.0124, 0.010) and not calibrate.rtt_misses(0.0109, 0.010)
    assert not calibrate.rtt_misses(0.0329, 0.030) and calibrate.rtt_misses(0.0331, 0.030)


def test_a_paths_target_is_what_one_flow_carries_through_its_loss_timed_for_50_losses():
    """By hand (Mathis et al.'s 1.2247 / sqrt(p) frames of 1514 bytes a round trip, the larger
    window at 10 ms; CUBIC's own, RFC 8312 5.1 with C = 0.4 and beta = 0.7, at 100 ms and 0.01 %):
    what a netns path and a host's path (launch/hostcal.py) are both held to. A BBR sender is held
    to the rate, dctcp to Reno's window, and a control whose response RFCs give no average of (htcp)
    to at least Reno's window and at most the rate. Plants that fail: CUBIC's beta 0.8 (the original
    paper's); a host's BBR judged as cubic; htcp's floor judged both ways."""
    from gctestbed.net import calibrate
    frames = 1.2247 / math.sqrt(0.005)                                 # 17.32 a round trip
    target, lossy, window, _ = calibrate.path_target(1_000_000_000, 0.010, 0.0102, 0.005, 1.5, "cubic")
    assert lossy and target == pytest.approx(frames * 1514 * 8 / 0.0102, rel=1e-3)           # 20.57 Mbit/s at the idle RTT
    assert window == pytest.approx(50 / (frames / 0.0102 * 0.005), rel=1e-3)                # 5.89 s
    assert calibrate.path_target(1_000_000_000, 0.010, 0.0102, 0.005, 1.5, "reno")[0] == target   # the same window
    assert calibrate.path_target(1_000_000_000, 0.010, 0.009, 0.005, 1.5, "cubic")[0] == pytest.approx(frames * 1514 * 8 / 0.010, rel=1e-3)
    assert calibrate.path_target(10_000_000, 0.010, 0.0102, 0.005, 1.5, "cubic") == (10_000_000, False, 1.5, None)   # the rate binds
    assert calibrate.path_target(1_000_000_000, 0.010, None, 0.0, 1.5, "cubic") == (1_000_000_000, False, 1.5, None)
    assert calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.001, 1.5, "cubic")[2] == 8.0          # capped: 3 losses
    # CUBIC's own window: 1.0538 x 0.1^0.75 / 0.0001^0.75 = 187.4 segments a round trip (Reno's 122.5)
    assert calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "cubic")[0] == pytest.approx(187.40 * 1514 * 8 / 0.1, rel=1e-3)
    assert calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "reno")[0] == pytest.approx(122.47 * 1514 * 8 / 0.1, rel=1e-3)
    assert calibrate.path_target(1_000_000_000, 0.010, 0.0102, 0.005, 1.5, "bbr") == (1_000_000_000, False, 1.5, None)
    assert calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "dctcp")[:2] == (pytest.approx(122.47 * 1514 * 8 / 0.1, rel=1e-3), True)
    htcp = calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "htcp")
    assert htcp.bps == pytest.approx(122.47 * 1514 * 8 / 0.1, rel=1e-3) and htcp.ceiling_bps == 1_000_000_000
    assert calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "dctcp").ceiling_bps is None
    # BBR v1 holds the rate to 15 % loss (the Linux patch's words); beyond, and bbr2, Reno's floor:
    # at 20 % and 10 ms, sqrt(1.5 / 0.2) = 2.739 frames a round trip, 3.318 Mbit/s
    assert calibrate.path_target(1_000_000_000, 0.010, 0.010, 0.15, 1.5, "bbr") == (1_000_000_000, False, 1.5, None)
    beyond = calibrate.path_target(1_000_000_000, 0.010, 0.010, 0.20, 1.5, "bbr")
    assert beyond.bps == pytest.approx(2.7386 * 1514 * 8 / 0.010, rel=1e-3) and beyond.ceiling_bps == 1_000_000_000
    assert calibrate.path_target(1_000_000_000, 0.010, 0.010, 0.005, 1.5, "bbr2").ceiling_bps == 1_000_000_000
    # judged: Reno's kind and cubic within 25 % of their average either way; htcp from 25 % under its
    # floor (14.8 Mbit/s) up to 10 % over the rate
    def miss(target, wire):
        return calibrate.PathResult(0, 1, "iperf3", target.bps, 0.1, wire, wire, 0.1, 0.1, target.loss_limited,
                                    target.ceiling_bps).miss
    reno = calibrate.path_target(1_000_000_000, 0.100, 0.100, 0.0001, 1.5, "reno")
    assert miss(reno, 1.2 * reno.bps) is None and "target of" in miss(reno, 1.3 * reno.bps) and miss(reno, 0.7 * reno.bps)
    for wire in (0.8 * htcp.bps, 1.3 * htcp.bps, 30 * htcp.bps, 1.09e9):
        assert miss(htcp, wire) is None, wire
    for wire in (0.7 * htcp.bps, 1.11e9, None):
        assert "at least 14.8" in miss(htcp, wire) and "at most its rate, 1000 Mbit/s" in miss(htcp, wire), wire


def test_teardown_leaves_nothing(state_dir):
    from gctestbed.launch.state import RunState

    state = RunState.create()
    net = topology.build(f"gct-{state.run_id}", state.subnet, TopologySpec.star(3, LinkSpec(bw_bps=100_000_000)),
                         "auto", 0, state.add)
    names = list(net.switches.values()) + [n.netns for n in net.nodes]
    assert all(namespaces.exists(n) for n in names)
    assert state.undo() == []
    assert not any(namespaces.exists(n) for n in names)
    assert not (state_dir / f"{state.run_id}.json").exists()
