"""The host's own CPU time, as the kernel counts it in /proc/stat, sampled while a run's steps go.

A node's CPU time misses what the kernel does for the network on its behalf: forwarding through
the switch namespace and the veth pairs, the qdiscs, TCP's acknowledgements, much of it in
softirq context charged to no process. On a small host emulating many nodes that work, not the
shaped link, can set the pace (64 replayed nodes at x64 on a 2-core host: the cores without idle
time through the collectives, the link 59 % used; docs/replay.md, "The host's own counters").
The kernel's counters see it: a host whose cores had no idle time for most of the measured steps
paced them itself.

The counters are the whole host's, all cores together: other jobs on the host count too, and one
saturated core among many idle ones does not read as saturated.
"""

from __future__ import annotations

import time

# an interval in which the host's cores were this busy (user, kernel, interrupts, steal) had no
# CPU to spare: whatever waited for a core in it waited on the host
SATURATED = 0.95
MAX_SAMPLES = 1200      # a long run's samples are thinned to every other one past this (bounded storage)
COVERED = 0.5           # a window the samples reach over less of than this has no figure (too little seen)
# a sample: time.time(), cumulative clock ticks by kind, and the seconds so far in which the host was
# SATURATED, judged interval by interval between consecutive polls (so thinning the samples later
# does not average short saturated stretches away)
FIELDS = ("t", "user", "system", "irq", "idle", "steal", "saturated_s")


def parse(line: str) -> list[int]:
    """/proc/stat's aggregate ``cpu`` line as clock ticks: user (with nice), system, interrupts
    (hard and soft), idle (with iowait) and steal. Guest time is left out because the kernel
    already counts it inside user and nice; a kernel that lists fewer fields gives zeros."""
    ticks = [int(x) for x in line.split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    return [user + nice, system, irq + softirq, idle + iowait, steal]


def read() -> list[float]:
    """time.time() and the host's CPU ticks so far (``parse``), read right after it."""
    with open("/proc/stat") as f:
        return [time.time(), *parse(f.readline())]


class Sampler:
    """The runner's samples of the host, one per poll: kept while the run's steps go
    (``tick(active=True)``), with the poll just before they began so that their start is
    bracketed, at most MAX_SAMPLES of them; each earlier poll only counts towards the saturated
    seconds."""

    def __init__(self) -> None:
        self.samples: list[list[float]] = []
        self._last: list[float] | None = None
        self._saturated_s = 0.0

    def tick(self, active: bool) -> None:
        """Read the host once; keep the sample if the steps have begun."""
        try:
            sample = read()
        except OSError:          # no /proc (not Linux): no figure
            return
        if self._last is not None and _saturated([b - a for a, b in zip(self._last[1:], sample[1:])]):
            self._saturated_s += sample[0] - self._last[0]
        before, self._last = self._last, sample + [self._saturated_s]
        if not active:
            return
        if not self.samples and before is not None:
            self.samples.append(before)
        self.samples.append(self._last)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2] if len(self.samples) % 2 else self.samples[::2] + self.samples[-1:]

    def record(self) -> dict | None:
        """What the store keeps: the samples, and what their columns are; None before any step."""
        return {"fields": list(FIELDS), "samples": [[round(v, 3) for v in s] for s in self.samples]} \
            if self.samples else None


def over(record: dict | None, start: float, end: float) -> dict | None:
    """The host's CPU from ``start`` to ``end`` (time.time() seconds): each cumulative counter
    read at both ends by straight-line interpolation between the two samples around it, so an
    interval that reaches past the window counts for the part of it inside (thinned samples can
    lie seconds apart); a window reaching past the samples is cut to them, and has no figure when
    they cover less than COVERED of it. The share of the cores' time that was busy, by kind, and
    the share of the (covered) window in which the cores were SATURATED. None without two
    distinct samples in it, or for samples stored before the saturated seconds were a column
    (commit e09d7bf, whose stores have no such figure)."""
    if not record or "saturated_s" not in record["fields"]:
        return None
    rows = sorted((dict(zip(record["fields"], s)) for s in record["samples"]), key=lambda r: r["t"])
    if len(rows) < 2:
        return None
    asked = end - start
    start, end = max(start, rows[0]["t"]), min(end, rows[-1]["t"])
    window = end - start
    if window <= 0 or window < COVERED * asked:
        return None
    first, last = _at(rows, start), _at(rows, end)
    d = {k: last[k] - first[k] for k in FIELDS[1:6]}
    total = sum(d.values())
    if total <= 0:
        return None
    return {"window_s": window, "busy": (total - d["idle"]) / total, "user": d["user"] / total,
            "system": d["system"] / total, "irq": d["irq"] / total, "steal": d["steal"] / total,
            "saturated_share": (last["saturated_s"] - first["saturated_s"]) / window}


def _at(rows: list[dict], t: float) -> dict:
    """Every cumulative column at time ``t`` (within the samples' span), on the straight line
    between the samples around it."""
    after = next(i for i, r in enumerate(rows) if r["t"] >= t)
    b = rows[after]
    if after == 0 or b["t"] == t:
        return b
    a = rows[after - 1]
    w = (t - a["t"]) / (b["t"] - a["t"])
    return {k: a[k] + w * (b[k] - a[k]) for k in FIELDS}


def _saturated(ticks: list[float]) -> bool:
    """Whether an interval's ticks (user, system, irq, idle, steal) were SATURATED busy."""
    total = sum(ticks)
    return total > 0 and (total - ticks[3]) / total >= SATURATED
