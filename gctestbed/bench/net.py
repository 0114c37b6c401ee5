"""How faithful the emulated network is on this machine: configured against measured.

For each rate and one-way latency, a fresh two-node star is built and measured: wire rate (the
sender's shaper counter) and goodput of one TCP stream, RTT idle and under that load. Three
references put those figures in context: the RTT floor of the probe itself (an unshaped veth
path, no delay stage), the delay line's own added delay at 0 ms, and the host's ceilings (the
rate above which this machine's CPU, not the shaper, limits) with and without the delay line.
"""

from __future__ import annotations

import os
import platform
from typing import Callable

from .. import testbed
from ..net import measure
from ..spec import LinkSpec, TopologySpec, format_duration, format_rate

RATES = (10_000_000, 100_000_000, 500_000_000, 1_000_000_000)
LATENCIES = (0.0, 0.001, 0.005, 0.02)
CEILING_BPS = 100_000_000_000     # htb at 100 gbit: the path, not the shaper, is the limit
RATE_TOLERANCE = 0.05
RTT_SLACK_S, RTT_TOLERANCE = 0.0003, 0.05


def _cell(rate_bps: int, latency_s: float, impl: str, seconds: float) -> dict:
    topo = TopologySpec.star(2, LinkSpec(bw_bps=rate_bps, latency_s=latency_s))
    with testbed.scratch(topo, impl) as net:
        a, b = net.nodes
        rtts = measure.rtt_s(a.netns, b.netns, b.address, count=30)
        flow = measure.throughput(b.netns, b.address, a.netns, seconds=seconds, warmup_s=1.5, probe_rtt=True)
        return {"rate_bps": rate_bps, "latency_s": latency_s, "impl": net.impl, "rtt_target_s": 2 * latency_s,
                "wire_bps": flow.wire_bps, "goodput_bps": flow.goodput_bps,
                "rtt_idle_s": measure.median(rtts), "rtt_idle_min_s": min(rtts),
                "rtt_loaded_s": measure.median(flow.rtt_loaded_s)}


def run(rates=RATES, latencies=LATENCIES, seconds: float = 3.0, on_cell: Callable[[str], None] = lambda s: None) -> dict:
    """Every cell of the grid plus the reference figures; the targets are judged per cell."""
    on_cell("probe floor and delay line at 0 ms")
    floor = _cell(CEILING_BPS, 0.0, "auto", seconds)
    line0 = _cell(CEILING_BPS, 0.0, "delayline", seconds)
    cells = []
    for rate in rates:
        for latency in latencies:
            on_cell(f"{format_rate(rate)}, latency {format_duration(latency)}")
            cell = _cell(rate, latency, "auto", seconds)
            cell["rate_error"] = (cell["wire_bps"] - rate) / rate if cell["wire_bps"] else None
            cell["rtt_excess_s"] = cell["rtt_idle_s"] - cell["rtt_target_s"]
            cell["rtt_excess_over_floor_s"] = cell["rtt_excess_s"] - floor["rtt_idle_s"]
            cell["rate_ok"] = cell["rate_error"] is not None and abs(cell["rate_error"]) <= RATE_TOLERANCE
            slack = max(RTT_SLACK_S, RTT_TOLERANCE * cell["rtt_target_s"])
            cell["rtt_ok"] = abs(cell["rtt_excess_s"]) <= slack
            cell["rtt_ok_over_floor"] = abs(cell["rtt_excess_over_floor_s"]) <= slack
            cells.append(cell)
    return {
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "cpu": _cpu()},
        "probe_floor": floor,
        "delayline_0ms": {**line0, "added_rtt_s": line0["rtt_idle_s"] - floor["rtt_idle_s"]},
        "ceiling": {"veth_wire_bps": floor["wire_bps"], "delayline_wire_bps": line0["wire_bps"]},
        "cells": cells,
    }


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()
