"""Trust but verify: measure every node's paths before a run and compare them with the topology.

Each node sends to the next one around a ring (for two nodes: both directions), so every
node's upload and every node's download is measured once. The target of a path is its
bottleneck rate and the sum of its delays, from the TopologySpec; on a path that loses packets,
the rate one TCP flow of the nodes' congestion control (cubic) can carry through that loss when
it is lower (loss_limited_bps), since a flow that reached the shaped rate there would be the
emulator failing to lose. Throughput is measured with
iperf3 when it is installed, else with the built-in TCP probe; either way the wire rate is read
from the sender's htb counter over the steady part of the transfer, and RTT with UDP probes,
idle and under that load (iputils ping when installed, else a UDP echo). An idle RTT that misses
is probed 20 times more (idle_rtt: a host's hiccup is brief, a wrong delay is not), and a lossy path's
flow is timed long enough to meet some 50 losses (lossy_seconds).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, NamedTuple

from ..spec import TopologySpec, series_loss_pct
from . import measure, namespaces
from .shaping import FRAME_BYTES
from .topology import TCP_CONGESTION_CONTROL

TOLERANCE = 0.10          # a path is a miss when its wire rate is more than 10 % off its target
LOSS_TOLERANCE = 0.25     # ... 25 % where loss sets the target: the response functions below are averages
RTT_SLACK_S = 0.001       # ... or its idle RTT is off by more than max(1 ms, 10 %)
LOSS_EVENTS = 50          # a lossy path's flow is timed until it should have met this many losses ...
LOSSY_MAX_S = 8.0         # ... or for this long at most: over 1.5 s (some 12 losses) its rate ranged -30..+41 %
IPERF_PORT = 5211


@dataclass
class PathResult:
    src: int
    dst: int
    tool: str
    target_bps: int
    target_rtt_s: float
    wire_bps: float | None
    goodput_bps: float
    rtt_idle_s: float | None
    rtt_loaded_s: float | None
    loss_limited: bool = False       # the target is loss_limited_bps, below the path's rate
    ceiling_bps: int | None = None   # where that is a floor (Reno's window, which the sender's control carries
    #                                  at least): the path's rate, the most its flow may carry
    congestion: str | None = None    # the sender's TCP congestion control (what a lossy path's target assumed)

    @property
    def floor(self) -> bool:
        return self.ceiling_bps is not None

    @property
    def rate_error(self) -> float | None:
        return None if self.wire_bps is None else (self.wire_bps - self.target_bps) / self.target_bps

    @property
    def miss(self) -> str | None:
        """Why this path misses its target, or None."""
        got = "no wire rate" if self.wire_bps is None else f"{self.wire_bps / 1e6:.1f} Mbit/s"
        if self.floor:
            if self.wire_bps is None or self.rate_error < -LOSS_TOLERANCE or self.wire_bps > self.ceiling_bps * (1 + TOLERANCE):
                return (f"node {self.src} -> {self.dst}: {got} against at least {self.target_bps / 1e6:g} Mbit/s (what "
                        f"Reno carries through the path's loss) and at most its rate, {self.ceiling_bps / 1e6:g} Mbit/s")
        elif self.wire_bps is None or abs(self.rate_error) > (LOSS_TOLERANCE if self.loss_limited else TOLERANCE):
            return (f"node {self.src} -> {self.dst}: {got} against a target of {self.target_bps / 1e6:g} Mbit/s"
                    + (" (what TCP carries through the path's loss)" if self.loss_limited else ""))
        if self.rtt_idle_s is None or rtt_misses(self.rtt_idle_s, self.target_rtt_s):
            got = "no RTT" if self.rtt_idle_s is None else f"RTT {self.rtt_idle_s * 1e3:.2f} ms"
            return f"node {self.src} -> {self.dst}: {got} against a target of {self.target_rtt_s * 1e3:.2f} ms"
        return None

    def to_dict(self) -> dict:
        return {**asdict(self), "rate_error": self.rate_error, "miss": self.miss}


def save(path: str, paths: list[PathResult], seconds: float) -> None:
    """The hosts' measured paths, and how long measuring them took (launch/hostcal.py)."""
    with open(path, "w") as f:
        json.dump({"paths": [p.to_dict() for p in paths], "seconds": seconds}, f)


def load(path: str) -> list[PathResult]:
    """The paths ``save`` wrote."""
    with open(path) as f:
        rows = json.load(f)["paths"]
    names = [f.name for f in fields(PathResult)]
    return [PathResult(**{k: row[k] for k in names if k in row}) for row in rows]


def load_seconds(path: str) -> float:
    """How long the measurement ``save`` wrote took."""
    with open(path) as f:
        return json.load(f)["seconds"]


def rtt_misses(rtt_s: float, target_s: float) -> bool:
    return abs(rtt_s - target_s) > max(RTT_SLACK_S, TOLERANCE * target_s)


def pairs(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)] if n > 1 else []


def targets(topo: TopologySpec, src: int, dst: int) -> tuple[int, float]:
    """(bottleneck rate, round-trip delay) of the path src -> dst and back."""
    out, back = topo.path(src, dst), topo.path(dst, src)
    return min(d.rate_bps for d in out), sum(d.delay_s for d in out) + sum(d.delay_s for d in back)


def path_loss(topo: TopologySpec, src: int, dst: int) -> float:
    """The share of packets the path src -> dst loses, its hops' losses together."""
    return series_loss_pct(d.loss_pct for d in topo.path(src, dst)) / 100


CUBIC_C, CUBIC_BETA = 0.4, 0.7        # CUBIC's constants (RFC 8312)
BBR_LOSS_LIMIT = 0.15                 # BBR v1 holds its rate through random loss up to this share
RENO_LIKE = ("reno", "dctcp")         # controls that answer a loss as Reno does (dctcp: RFC 8257), averaging its window


def loss_limited_bps(rtt_s: float, loss: float, congestion: str) -> float | None:
    """The wire rate one flow of ``congestion`` control averages through random loss ``loss`` at
    round trip ``rtt_s``, a window a round trip counted in full frames on the wire. Reno: Mathis et
    al. 1997's 1.22 / sqrt(p) segments. Cubic: the larger of its two windows in RFC 8312 section
    5.1, that Reno-friendly one and its own ((C (3 + beta) / (4 (1 - beta)))^(1/4) x RTT^(3/4) /
    p^(3/4) segments). BBR (v1, Linux's "bbr") up to 15 % loss: None, held to the rate (the Linux
    patch that brought it: below 15 % it fully uses the path, reaching the rate x (1 - p) in data).
    Any other, BBR beyond 15 % and its later versions (which back off above about 2 % a round)
    included: Reno's window, which Linux's other loss-based controls carry at least (htcp, bic,
    highspeed are Reno-friendly): a floor there (carried_at_least)."""
    if congestion == "bbr" and loss <= BBR_LOSS_LIMIT:
        return None
    window = math.sqrt(1.5 / loss)
    if congestion == "cubic":
        window = max(window, (CUBIC_C * (3 + CUBIC_BETA) / (4 * (1 - CUBIC_BETA))) ** 0.25 * rtt_s ** 0.75 / loss ** 0.75)
    return window * FRAME_BYTES * 8 / rtt_s


def carried_at_least(congestion: str) -> bool:
    """Whether loss_limited_bps is only the least a flow of ``congestion`` carries through loss (any
    control but Reno's kind and CUBIC, whose averages it gives; BBR where it has a figure at all,
    beyond BBR_LOSS_LIMIT). A delay-based
    control (vegas, lp, nv, cdg) is held to that floor too, which it may not reach: a miss there
    may be the control's, not the emulator's (docs/clusters.md)."""
    return not (congestion in RENO_LIKE or congestion == "cubic")


class Target(NamedTuple):
    """What a path is held to (path_target)."""

    bps: int                         # the rate its flow should carry ...
    loss_limited: bool               # ... which its loss sets, below its rate
    seconds: float                   # how long to time the flow
    ceiling_bps: int | None = None   # where bps is a floor (carried_at_least): the path's rate, the most


def calibrate(topo: TopologySpec, nodes: list, seconds: float = 1.5, warmup_s: float = 1.0,
              tool: str = "auto") -> list[PathResult]:
    """Measure every ring path; ``nodes`` have ``netns`` and ``address`` (net.topology.NodePort)."""
    use_iperf = tool == "iperf3" or (tool == "auto" and shutil.which("iperf3") is not None)
    results = []
    for src, dst in pairs(len(nodes)):
        a, b = nodes[src], nodes[dst]
        rate, rtt = targets(topo, src, dst)
        idle = idle_rtt(lambda n: measure.rtt_s(a.netns, b.netns, b.address, count=n), rtt)
        target = path_target(rate, rtt, idle, path_loss(topo, src, dst), seconds, TCP_CONGESTION_CONTROL)
        if use_iperf:
            flow = _iperf3(a, b, target.seconds, warmup_s)
        else:
            flow = measure.throughput(b.netns, b.address, a.netns, seconds=target.seconds, warmup_s=warmup_s, probe_rtt=True)
        results.append(PathResult(src, dst, "iperf3" if use_iperf else "builtin", target.bps, rtt, flow.wire_bps,
                                  flow.goodput_bps, idle, measure.median(flow.rtt_loaded_s), target.loss_limited,
                                  target.ceiling_bps, TCP_CONGESTION_CONTROL))
    return results


def idle_rtt(probe: Callable[[int], list[float]], target_s: float) -> float | None:
    """The idle round trip of a path: the median of 10 probes, or, where that misses ``target_s``,
    of those and 20 more (``probe(n)``: n round trips, in seconds). A host's hiccup (this VM's vCPU
    descheduled: timer wake-ups came up to 8 ms late, in bursts) lifts a run of probes, and the
    delay line's frames with them; a delay set wrong, or a host late for longer, lifts most of the
    30 and still misses."""
    rtts = probe(10)
    idle = measure.median(rtts)
    if idle is None or rtt_misses(idle, target_s):
        rtts = rtts + probe(20)
        idle = measure.median(rtts)
    return idle


def path_target(rate_bps: int, rtt_s: float, idle_s: float | None, loss: float, seconds: float,
                congestion: str) -> Target:
    """What a path is held to, of bottleneck ``rate_bps`` and round trip ``rtt_s`` (measured
    idle: ``idle_s``) that loses ``loss`` of its
    packets, whose sender's flows run ``congestion`` control (a node's: topology's
    TCP_CONGESTION_CONTROL; a host's: its own default): through loss, what one such flow carries at
    the round trip it meets (the host adds its own), timed for ``lossy_seconds``, where that is
    known (loss_limited_bps) and below the rate, as the least it carries where that is all the
    response function says (carried_at_least)."""
    carried = loss_limited_bps(max(idle_s or rtt_s, rtt_s, 1e-4), loss, congestion) if loss > 0 else None
    if carried is None or carried >= rate_bps:
        return Target(rate_bps, False, seconds)
    return Target(round(carried), True, lossy_seconds(carried, loss, seconds),
                  rate_bps if carried_at_least(congestion) else None)


def lossy_seconds(carried_bps: float, loss: float, seconds: float) -> float:
    """How long to time a flow through ``loss`` that carries ``carried_bps``: long enough to meet
    LOSS_EVENTS losses, so that its average is one of the response function's kind (a flow's rate
    follows its few losses), but never shorter than ``seconds`` nor longer than LOSSY_MAX_S."""
    events_per_s = carried_bps / (FRAME_BYTES * 8) * loss
    return max(seconds, min(LOSSY_MAX_S, LOSS_EVENTS / events_per_s))


def _iperf3_client(a, b, seconds: float, warmup_s: float) -> subprocess.Popen:
    """Start the client, retrying while the server is not listening yet (probing its port
    ourselves would use up its single session)."""
    argv = ["iperf3", "-c", b.address, "-p", str(IPERF_PORT), "-t", f"{warmup_s + seconds:g}", "-O", f"{warmup_s:g}", "-J"]
    for _ in range(50):
        client = namespaces.popen(a.netns, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            out, _ = client.communicate(timeout=0.3)
        except subprocess.TimeoutExpired:
            return client                      # connected and running
        if "unable to connect" not in out:
            raise RuntimeError(f"iperf3 {a.address} -> {b.address} failed: {out.strip()[:300]}")
        time.sleep(0.1)
    raise RuntimeError(f"iperf3 server on {b.address} never started listening")


def _iperf3(a, b, seconds: float, warmup_s: float) -> measure.Throughput:
    """One iperf3 TCP test a -> b; wire rate and loaded RTT sampled alongside it."""
    server = namespaces.popen(b.netns, ["iperf3", "-s", "-1", "-B", b.address, "-p", str(IPERF_PORT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        client = _iperf3_client(a, b, seconds, warmup_s)
        time.sleep(warmup_s)
        t0, c0 = time.perf_counter(), measure.sender_class_bytes(a.netns, "eth0")
        loaded = measure.loaded_rtts(a.netns, b.netns, b.address, 10, seconds / 12)
        time.sleep(max(0.0, t0 + 0.9 * seconds - time.perf_counter()))   # close the window while it still sends
        t1, c1 = time.perf_counter(), measure.sender_class_bytes(a.netns, "eth0")
        out, err = client.communicate(timeout=warmup_s + seconds + 30)
        report = json.loads(out)
        if "error" in report:
            raise RuntimeError(f"iperf3 {a.address} -> {b.address}: {report['error']}")
        goodput = report["end"]["sum_received"]["bits_per_second"]
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    wire = (c1 - c0) * 8 / (t1 - t0) if c0 is not None and c1 is not None else None
    return measure.Throughput(goodput_bps=goodput, wire_bps=wire, rtt_loaded_s=loaded)
