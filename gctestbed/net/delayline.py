"""The userspace delay line: latency, jitter and loss on kernels without netem.

One compiled relay (native/net/delayline.cpp) serves every cable of a network: it owns each cable's
two TAP devices, one in each namespace the cable joins, and moves frames between them through a
timestamped FIFO per direction. Packets stay in the kernel's TCP at both ends, so senders see the
real round trip (a proxy would hide it). The kernel's htb on each TAP still does the rate; the relay
only delays and drops. A cable with loss has offloads off so that loss hits MTU-sized packets, not
64 KB GSO frames (this costs throughput: a lossy cable is meant for modest rates); without loss, a
node's own TCP sends GSO packets of at most 1 ms of its slowest path (topology.gso_segments), single
frames on a slow one. A cable a loss fault may strike later has offloads off from the start, and the
relay takes commands on its stdin: a direction's loss mid-run (a fault), its delay between the cells
of a sweep that keeps its network, a new seed for every direction's generator (each cell of such a
sweep draws the delays a network of its own would, whatever the cells before it drew), and the
counters so far. Each direction's counters carry the first delays it drew since it was last seeded
(``first_delays_us``: before the line's no-reordering clamp, -1 for a frame lost), so two runs can
be shown to have drawn the same sequence.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Callable

from .. import kernels
from ..spec import Direction
from . import namespaces
from .cable import Cable

PROGRAM, SOURCES = "gct_delayline", ["net/delayline.cpp"]


def program() -> str:
    """Path of the relay, built on first use."""
    return kernels.executable(PROGRAM, SOURCES)


def start(cables: list[Cable], seed: int, record: Callable[..., None]) -> subprocess.Popen:
    """Start the relay for ``cables``; return once every TAP exists."""
    argv = [program(), str(seed)]
    for c in cables:
        offload = 0 if (c.lossy or c.hop.ab.loss_pct or c.hop.ba.loss_pct) else 1
        argv += [os.path.join(namespaces.NETNS_DIR, c.a_ns), c.a_if, os.path.join(namespaces.NETNS_DIR, c.b_ns), c.b_if,
                 *_direction_args(c.hop.ab), *_direction_args(c.hop.ba), str(offload)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    record("process", name="delayline", pid=proc.pid)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"the delay line did not start: {err.strip() or line}")
    return proc


def set_loss(proc: subprocess.Popen, cable: int, direction: str, loss_pct: float) -> None:
    """Make direction ``ab`` or ``ba`` of the ``cable``-th cable lose ``loss_pct`` percent from now."""
    _command(proc, f"loss {cable} {direction} {round(loss_pct * 1e4)}")


def retune(proc: subprocess.Popen, cable: int, direction: str, d: Direction) -> None:
    """Give direction ``ab`` or ``ba`` of the ``cable``-th cable the delay and jitter of ``d`` from
    now (frames already queued keep theirs); its loss too."""
    delay, jitter, loss = _direction_args(d)
    _command(proc, f"delay {cable} {direction} {delay} {jitter}")
    _command(proc, f"loss {cable} {direction} {loss}")


def reseed(proc: subprocess.Popen, seed: int) -> None:
    """Restart every direction's generator from ``seed``, as ``start`` seeded it: the delays,
    jitter and losses drawn from now on are those of a relay started now with ``seed``."""
    _command(proc, f"seed {seed}")


def counters(proc: subprocess.Popen) -> dict:
    """The relay's counters so far by direction, as ``stop`` returns them at the end."""
    return {row.pop("direction"): row for row in json.loads(_command(proc, "counters"))}


def _command(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    reply = proc.stdout.readline().strip()
    if reply.startswith("error") or not reply:
        raise RuntimeError(f"the delay line refused '{line}': {reply or proc.stderr.read().strip()}")
    return reply


def stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> dict:
    """Stop the relay and return its counters by direction ({} if it died without them)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    counters = {}
    for line in out.strip().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        counters[row.pop("direction")] = row
    return counters


def _direction_args(d: Direction) -> list[str]:
    return [str(round(d.delay_s * 1e6)), str(round(d.jitter_s * 1e6)), str(round(d.loss_pct * 1e4))]
