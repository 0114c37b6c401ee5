"""Interface byte counters: the proof that traffic crossed the shaped link.

psutil reads /proc/net/dev, which shows the interfaces of the caller's own network namespace,
so a worker inside a node namespace sees exactly its ``eth0``.
"""

from __future__ import annotations

import psutil


def read(ifname: str = "eth0") -> tuple[int, int]:
    """(bytes sent, bytes received) on ``ifname`` since it was created."""
    c = psutil.net_io_counters(pernic=True)[ifname]
    return c.bytes_sent, c.bytes_recv
