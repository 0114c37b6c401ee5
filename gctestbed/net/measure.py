"""Built-in measurements between two namespaces: TCP throughput, RTT idle and under load, loss.

They need nothing installed. Throughput is reported twice: goodput (application bytes the
receiver got) and wire rate (bytes the sender's shaper let through, headers included, read from
its htb class counter), because tc rates are wire rates and goodput sits ~4.6 % under them.
RTT is measured with iputils ping when it is installed (its own overhead is ~0.08 ms here) and
otherwise with small UDP datagrams echoed by a Python thread (~0.2 ms); either way the probes
queue behind bulk traffic exactly as a collective's messages would.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import statistics
import subprocess
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from pyroute2 import netns

from . import namespaces, shaping

TCP_PORT, ECHO_PORT = 5201, 5202
CHUNK = 1 << 20


@dataclass
class Throughput:
    goodput_bps: float
    wire_bps: float | None
    rtt_loaded_s: list[float] = field(default_factory=list)


def sender_class_bytes(ns: str | None, ifname: str) -> int | None:
    with namespaces.iproute(ns) as ipr:
        link = shaping.link_class(shaping.describe(ipr, ifname))
    return link.get("sent_bytes") if link else None


class Echo:
    """A UDP echo server inside a namespace, for as long as the ``with`` lasts."""

    def __init__(self, ns: str, addr: str, port: int = ECHO_PORT):
        self.sock = netns.create_socket(ns, socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, port))
        self.sock.settimeout(0.2)
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while self.running:
            try:
                data, peer = self.sock.recvfrom(2048)
            except (socket.timeout, OSError):
                continue
            self.sock.sendto(data, peer)

    def __enter__(self) -> "Echo":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


def ping(client_ns: str, addr: str, count: int, interval_s: float, timeout_s: float,
          port: int = ECHO_PORT) -> tuple[list[float], int]:
    """RTTs of the echoed probes, and how many were sent."""
    sock = netns.create_socket(client_ns, socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(timeout_s)
    rtts = []
    try:
        for seq in range(count):
            sent = time.perf_counter()
            sock.sendto(struct.pack("!Id", seq, sent) + bytes(56), (addr, port))
            deadline = sent + timeout_s
            while time.perf_counter() < deadline:
                try:
                    data, _ = sock.recvfrom(2048)
                except socket.timeout:
                    break
                got, _t = struct.unpack("!Id", data[:12])
                if got == seq:
                    rtts.append(time.perf_counter() - sent)
                    break
            time.sleep(max(0.0, interval_s - (time.perf_counter() - sent)))
    finally:
        sock.close()
    return rtts, count


def rtt_s(client_ns: str, server_ns: str, server_addr: str, count: int = 20, interval_s: float = 0.02) -> list[float]:
    """Round-trip times of ``count`` probes on an idle path (after one unrecorded probe that
    resolves the neighbours' addresses, which would otherwise add a round trip)."""
    if shutil.which("ping"):
        return icmp_rtts(client_ns, server_addr, count, interval_s)
    with Echo(server_ns, server_addr):
        ping(client_ns, server_addr, 1, 0.0, timeout_s=1.0)
        rtts, _ = ping(client_ns, server_addr, count, interval_s, timeout_s=1.0)
    return rtts


_TIME = re.compile(r"icmp_seq=(\d+) .*time=([0-9.]+) ms")


def icmp_rtts(client_ns: str, addr: str, count: int, interval_s: float, skip_first: bool = True) -> list[float]:
    """RTTs reported by iputils ping run inside ``client_ns`` (the first one left out if asked)."""
    argv = ["ping", "-n", "-c", str(count + skip_first), "-i", f"{max(interval_s, 0.002):.3f}", "-W", "2", addr]
    out = namespaces.popen(client_ns, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).communicate()[0]
    replies = [(int(m.group(1)), float(m.group(2)) / 1e3) for m in _TIME.finditer(out)]
    return [rtt for seq, rtt in replies if not (skip_first and seq == 1)]


def loaded_rtts(client_ns: str, server_ns: str, addr: str, count: int, interval_s: float) -> list[float]:
    """RTTs while something else loads the path (no warm-up probe: the path is warm)."""
    if shutil.which("ping"):
        return icmp_rtts(client_ns, addr, count, interval_s, skip_first=False)
    with Echo(server_ns, addr):
        return ping(client_ns, addr, count, interval_s, timeout_s=2.0)[0]


def loss_fraction(client_ns: str, server_ns: str, server_addr: str, count: int = 2000,
                  interval_s: float = 0.0005, port: int = ECHO_PORT) -> float:
    """Fraction of ``count`` paced probes whose echo never came back (both directions' loss)."""
    with Echo(server_ns, server_addr, port):
        ping(client_ns, server_addr, 3, 0.0, timeout_s=1.0, port=port)
        sock = netns.create_socket(client_ns, socket.AF_INET, socket.SOCK_DGRAM)
        sock.settimeout(1.0)
        back: set[int] = set()

        def collect() -> None:
            while True:
                try:
                    data, _ = sock.recvfrom(2048)
                except (socket.timeout, OSError):
                    return
                back.add(struct.unpack("!I", data[:4])[0])

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        start = time.perf_counter()
        for seq in range(count):
            sock.sendto(struct.pack("!Id", seq, 0.0) + bytes(56), (server_addr, port))
            time.sleep(max(0.0, start + (seq + 1) * interval_s - time.perf_counter()))
        collector.join()
        sock.close()
    return 1 - len(back & set(range(count))) / count


class Sink:
    """A TCP receiver in namespace ``ns`` (this process's when None) for one stream: the bytes
    that arrive after ``warmup_s``, over the time they took, are the goodput."""

    def __init__(self, ns: str | None, addr: str, warmup_s: float, port: int = TCP_PORT):
        self.addr, self.port, self.warmup_s = addr, port, warmup_s
        self.server = netns.create_socket(ns)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((addr, port))
        self.server.listen(1)
        self.server.settimeout(10)
        self.window: dict[str, float] = {}
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            with conn:
                start = time.perf_counter()
                counted = 0
                while data := conn.recv(CHUNK):
                    now = time.perf_counter()
                    if now - start >= self.warmup_s:
                        self.window.setdefault("t0", now)
                        counted += len(data)
                        self.window["t1"], self.window["bytes"] = now, counted

    def close(self) -> None:
        self.server.close()
        self.thread.join(timeout=30)

    def goodput_bps(self) -> float:
        """Once the sender has closed: the goodput, or RuntimeError when nothing arrived after the warm-up."""
        self.thread.join(timeout=30)
        self.server.close()
        span = self.window.get("t1", 0.0) - self.window.get("t0", 0.0)
        if span <= 0:
            raise RuntimeError(f"no data reached {self.addr}:{self.port} after the warm-up")
        return self.window["bytes"] * 8 / span


def send(client_ns: str | None, addr: str, seconds: float, warmup_s: float, ifname: str = "eth0",
         probe_rtt: Callable[[], list[float]] | None = None, port: int = TCP_PORT) -> tuple[float | None, list[float]]:
    """One TCP stream from ``client_ns`` to a Sink at ``addr`` for ``warmup_s + seconds``: the wire
    rate the sender's htb class on ``ifname`` let through after the warm-up (None where it has none),
    and the RTTs ``probe_rtt`` took under that load."""
    client = netns.create_socket(client_ns)
    loaded: list[float] = []
    try:
        client.settimeout(10)
        client.connect((addr, port))
        payload = bytes(CHUNK)
        start = time.perf_counter()
        wire0 = wire1 = None
        prober = None
        while (elapsed := time.perf_counter() - start) < warmup_s + seconds:
            if wire0 is None and elapsed >= warmup_s:
                wire0 = (time.perf_counter(), sender_class_bytes(client_ns, ifname))
                if probe_rtt:
                    prober = threading.Thread(target=lambda: loaded.extend(probe_rtt()), daemon=True)
                    prober.start()
            client.sendall(payload)
        wire1 = (time.perf_counter(), sender_class_bytes(client_ns, ifname))
        if prober:
            prober.join()
    finally:
        client.close()
    wire = None
    if wire0 and wire0[1] is not None and wire1[1] is not None and wire1[0] > wire0[0]:
        wire = (wire1[1] - wire0[1]) * 8 / (wire1[0] - wire0[0])
    return wire, loaded


def throughput(server_ns: str, server_addr: str, client_ns: str, seconds: float = 3.0, warmup_s: float = 1.0,
               probe_rtt: bool = False, port: int = TCP_PORT) -> Throughput:
    """One TCP stream from ``client_ns`` to ``server_addr``, measured after a warm-up (slow start)."""
    sink = Sink(server_ns, server_addr, warmup_s, port)
    probe = (lambda: loaded_rtts(client_ns, server_ns, server_addr, 10, seconds / 12)) if probe_rtt else None
    try:
        wire, loaded = send(client_ns, server_addr, seconds, warmup_s, probe_rtt=probe, port=port)
    except BaseException:
        sink.close()
        raise
    return Throughput(goodput_bps=sink.goodput_bps(), wire_bps=wire, rtt_loaded_s=loaded)


def throughput_bps(server_ns: str, server_addr: str, client_ns: str, seconds: float = 3.0) -> float:
    """Goodput of one TCP stream, in bits/s."""
    return throughput(server_ns, server_addr, client_ns, seconds=seconds, warmup_s=0.5).goodput_bps


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
