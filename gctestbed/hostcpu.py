"""The host's own CPU time, as the kernel counts it in /proc/stat, sampled while a run's steps go.

A node's CPU time misses what the kernel does for the network on its behalf: forwarding through
the switch namespace and the veth pairs, the qdiscs, TCP's acknowledgements, much of it in
softirq context charged to no process. On a small host emulating many nodes that work, not the
shaped link, can set the pace (64 replayed nodes at x64 on a 2-core host: the cores without idle
time through the collectives, the link 54 % used; docs/replay.md, "When the host falls behind").
The kernel's counters see it: a host whose cores had no idle time for most of the measured steps
paced them itself.
"""

from __future__ import annotations

import time

# an interval in which the host's cores were this busy (user, kernel, interrupts, steal) had no
# CPU to spare: whatever waited for a core in it waited on the host
SATURATED = 0.95
MAX_SAMPLES = 1200      # a long run's samples are thinned to every other one past this (bounded storage)
FIELDS = ("t", "user", "system", "irq", "idle", "steal")   # a sample: time.time() and cumulative clock ticks


def read() -> list[float]:
    """The host's CPU time so far, all cores together, in clock ticks: user (with nice), system,
    interrupts (hard and soft), idle (with iowait) and steal, after the moment it was read."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    return [time.time(), user + nice, system, irq + softirq, idle + iowait, steal]


class Sampler:
    """Samples of read() taken while the run's steps go (``tick(active=True)``), with the one just
    before they began, so that the first step is bracketed too; at most MAX_SAMPLES of them."""

    def __init__(self) -> None:
        self.samples: list[list[float]] = []
        self._before: list[float] | None = None

    def tick(self, active: bool) -> None:
        try:
            sample = read()
        except OSError:          # no /proc (not Linux): no figure
            return
        if not active:
            self._before = sample
            return
        if not self.samples and self._before is not None:
            self.samples.append(self._before)
        self.samples.append(sample)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2] if len(self.samples) % 2 else self.samples[::2] + self.samples[-1:]

    def record(self) -> dict | None:
        """What the store keeps: the samples, and what their columns are."""
        return {"fields": list(FIELDS), "samples": [[round(v, 3) for v in s] for s in self.samples]} \
            if len(self.samples) >= 2 else None


def over(record: dict | None, start: float, end: float) -> dict | None:
    """The host's CPU over the samples taken from ``start`` to ``end`` (time.time() seconds): the
    share of its cores' time that was busy, by kind, and the share of the time in which the cores
    were SATURATED. None without two such samples (no figure, or a window shorter than the
    sampling's period)."""
    if not record:
        return None
    rows = [dict(zip(record["fields"], s)) for s in record["samples"]]
    inside = [r for r in rows if start <= r["t"] <= end]
    if len(inside) < 2:
        return None
    saturated = 0.0
    for a, b in zip(inside, inside[1:]):
        d = {k: b[k] - a[k] for k in FIELDS[1:]}
        total = sum(d.values())
        if total > 0 and (total - d["idle"]) / total >= SATURATED:
            saturated += b["t"] - a["t"]
    first, last = inside[0], inside[-1]
    d = {k: last[k] - first[k] for k in FIELDS[1:]}
    total = sum(d.values())
    if total <= 0:
        return None
    window = last["t"] - first["t"]
    return {"window_s": window, "busy": (total - d["idle"]) / total, "user": d["user"] / total,
            "system": d["system"] / total, "irq": d["irq"] / total, "steal": d["steal"] / total,
            "saturated_share": saturated / window if window > 0 else 0.0}
