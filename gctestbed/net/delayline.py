"""The userspace delay line: latency, jitter and loss on kernels without netem.

A compiled relay (kernels/net/delayline.cpp) owns two TAP devices, one in each namespace of a
cable, and moves frames between them through a timestamped FIFO per direction. Packets stay
in the kernel's TCP at both ends, so senders see the real round trip (a proxy would hide it).
The kernel's htb on each TAP still does the rate; the relay only delays and drops. With loss
configured, offloads are turned off so that loss hits MTU-sized packets, not 64 KB GSO frames
(this costs throughput: a lossy link is meant for modest rates).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Callable

import psutil

from .. import kernels
from ..spec import Direction
from . import namespaces

PROGRAM, SOURCES = "gct_delayline", ["net/delayline.cpp"]


def program() -> str:
    """Path of the relay, built on first use."""
    return kernels.executable(PROGRAM, SOURCES)


def start(a_ns: str, a_if: str, b_ns: str, b_if: str, ab: Direction, ba: Direction, seed: int,
          record: Callable[..., None]) -> subprocess.Popen:
    """Start a relay that creates ``a_if`` in ``a_ns`` and ``b_if`` in ``b_ns``; return once both exist."""
    offload = 0 if (ab.loss_pct or ba.loss_pct) else 1
    argv = [program(),
            os.path.join(namespaces.NETNS_DIR, a_ns), a_if, os.path.join(namespaces.NETNS_DIR, b_ns), b_if,
            *_direction_args(ab), *_direction_args(ba), str(seed), str(offload)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    record("process", name=f"delayline {a_ns}/{a_if}", pid=proc.pid, started=_started(proc.pid))
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"the delay line for {a_ns}/{a_if} did not start: {err.strip() or line}")
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> dict:
    """Stop a relay and return its counters per direction ({} if it died without them)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def _direction_args(d: Direction) -> list[str]:
    return [str(round(d.delay_s * 1e6)), str(round(d.jitter_s * 1e6)), str(round(d.loss_pct * 1e4))]


def _started(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0
