"""A built-in TCP throughput probe between two namespaces, for when iperf3 is not installed.

The receiver counts application bytes (goodput) after a short warm-up so slow start does not
pull the figure down; goodput sits a few percent under the shaped wire rate because Ethernet,
IP and TCP headers also take link time.
"""

from __future__ import annotations

import socket
import threading
import time

from pyroute2 import netns

PORT = 5201
CHUNK = 1 << 20


def throughput_bps(server_ns: str, server_addr: str, client_ns: str, seconds: float = 3.0,
                   warmup_s: float = 0.5, port: int = PORT) -> float:
    """Goodput in bits/s of one TCP stream from ``client_ns`` to ``server_addr`` in ``server_ns``."""
    server = netns.create_socket(server_ns)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((server_addr, port))
    server.listen(1)
    server.settimeout(10)
    window: dict[str, float] = {}

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            start = time.perf_counter()
            counted = 0
            while data := conn.recv(CHUNK):
                now = time.perf_counter()
                if now - start >= warmup_s:
                    window.setdefault("t0", now)
                    counted += len(data)
                    window["t1"], window["bytes"] = now, counted

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    client = netns.create_socket(client_ns)
    try:
        client.settimeout(10)
        client.connect((server_addr, port))
        payload = bytes(CHUNK)
        end = time.perf_counter() + warmup_s + seconds
        while time.perf_counter() < end:
            client.sendall(payload)
    finally:
        client.close()
        receiver.join(timeout=30)
        server.close()
    span = window.get("t1", 0.0) - window.get("t0", 0.0)
    if span <= 0:
        raise RuntimeError(f"no data reached {server_addr}:{port} after the warm-up")
    return window["bytes"] * 8 / span
