"""Calibration across real hosts, then training, in one torchrun job: ``python -m
gctestbed.launch.hostcal SPEC.json OUT.json`` under torchrun, one process per host.

A netns run measures every path from one process, which sees every namespace; hosts see only
themselves, so here each host measures its own side and the hosts take turns over a Gloo group.
Around the ring, one pair at a time, the receiving host runs a TCP sink and a UDP echo on its
address, and the sending host measures idle RTT (ping, else the echo), then sends one TCP stream,
reading the wire rate from its own NIC's htb class and RTT under that load. The goodput comes back
from the receiver. Each path's target is the sender's shaped rate and the sum of both hosts'
delays; through the sender's loss, what one flow of the sender's own congestion control carries
(calibrate.path_target). Every host writes the same list of paths to OUT.json (numbered by the
training's ranks), for its Session to judge and store.

Calibration and training share one rendezvous and one process group: a second torchrun job on the
same rendezvous port raced the first one's shutdown (a host's new agent could meet the other
host's old store) and, rarely, hung both hosts. When a path misses and misses are not accepted,
every host sees the same list and exits with ``MISSED`` before training.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import sys
from datetime import timedelta
from typing import NamedTuple

import torch.distributed as dist

from .. import worker
from ..net import calibrate, measure, nic
from ..spec import RunSpec
from ..timing import Laps

SECONDS, WARMUP_S = 1.5, 1.0
PORT = calibrate.IPERF_PORT + 1
MISSED = 3          # the exit status of every host when calibration stops the run


def _rtts(addr: str, count: int, interval_s: float, first: bool) -> list[float]:
    """RTTs to ``addr`` from this host: ICMP where ping is installed, else the peer's UDP echo."""
    if shutil.which("ping"):
        return measure.icmp_rtts(None, addr, count, interval_s, skip_first=first)
    if first:
        measure.ping(None, addr, 1, 0.0, timeout_s=1.0)
    return measure.ping(None, addr, count, interval_s, timeout_s=2.0)[0]


class Host(NamedTuple):
    """What each host tells the others before the paths are measured: its side of every path."""
    address: str
    rate_bps: int           # its egress rate: a path's rate is its sender's
    delay_s: float          # its one-way delay: a path's round trip is both hosts'
    loss: float             # its egress loss (a share, not percent): its data's
    congestion: str         # the congestion control its flows run (nic.congestion_control)


def measure_ring(spec: RunSpec, rank: int, world: int, ifname: str, group=None) -> list[calibrate.PathResult]:
    """Every ring path, one at a time; the same list on every host. ``group``: a Gloo group (the
    objects exchanged here are CPU tensors, which NCCL cannot carry)."""
    addr = nic.address(ifname)
    if addr is None:
        raise SystemExit(f"gctestbed: {ifname} has no IPv4 address to calibrate from")
    me = Host(addr, spec.link.bw_bps, spec.link.latency_s, spec.link.loss_pct / 100, nic.congestion_control())
    hosts: list = [None] * world
    dist.all_gather_object(hosts, me, group=group)
    paths = []
    for src, dst in calibrate.pairs(world):
        target_rtt = hosts[src].delay_s + hosts[dst].delay_s
        sink = None
        with contextlib.ExitStack() as receiving:
            if rank == dst:
                sink = measure.Sink(None, me.address, WARMUP_S, PORT)
                receiving.enter_context(measure.Echo(None, me.address))
            dist.barrier(group=group)
            sent: tuple | str | None = None
            goodput = None
            if rank == src:
                peer = hosts[dst].address
                try:
                    idle = calibrate.idle_rtt(lambda n: _rtts(peer, n, 0.02, first=True), target_rtt)
                    target = calibrate.path_target(hosts[src].rate_bps, target_rtt, idle, hosts[src].loss,
                                                   SECONDS, hosts[src].congestion)
                    wire, loaded = measure.send(None, peer, target.seconds, WARMUP_S, ifname, port=PORT,
                                                probe_rtt=lambda: _rtts(peer, 10, target.seconds / 12, first=False))
                    sent = (idle, wire, measure.median(loaded), target)
                except OSError as e:            # the peer cannot be reached: every host says so, none hangs
                    sent = f"{type(e).__name__}: {e}"
            if sink:
                try:
                    goodput = sink.goodput_bps()
                except RuntimeError:
                    goodput = None
        both: list = [None] * world
        dist.all_gather_object(both, (sent, goodput), group=group)
        if isinstance(both[src][0], str):
            raise SystemExit(f"gctestbed: calibration from {hosts[src].address} to {hosts[dst].address} failed: {both[src][0]}")
        idle, wire, loaded, target = both[src][0]
        paths.append(calibrate.PathResult(src, dst, "builtin", target.bps, target_rtt, wire, both[dst][1], idle, loaded,
                                          target.loss_limited, target.ceiling_bps, hosts[src].congestion))
    return paths


def main(argv: list[str]) -> None:
    faulthandler.enable()         # an abort in C++ leaves the Python stack in the node's log
    spec_path, out = argv
    with open(spec_path) as f:
        spec = RunSpec.from_json(f.read())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ifname = os.environ.get("GCTESTBED_IFNAME", "eth0")
    dist.init_process_group(spec.backend, rank=rank, world_size=world, timeout=timedelta(seconds=spec.timeout_s))
    laps = Laps()
    try:
        paths = measure_ring(spec, rank, world, ifname, None if spec.backend == "gloo" else dist.new_group(backend="gloo"))
    except BaseException:
        dist.destroy_process_group()
        raise
    calibrate.save(out, paths, laps.lap())
    if any(p.miss for p in paths) and not spec.accept_miss:
        worker.leave(MISSED)
    worker.main([spec_path])


if __name__ == "__main__":
    main(sys.argv[1:])
