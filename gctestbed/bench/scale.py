"""How gctestbed scales on this host: the same small job on 2, 4, ... N nodes, one run each, and
what each cost: the fixed cost around its steps (network up, interpreters and process groups
started, evaluation, teardown), memory per node, the median step and the bus bandwidth against
the link. Every figure is the run's own record (``show``), so a row can be looked up later.

A row whose run failed (too little memory for that many nodes, a node that died) says so and the
bench goes on: how far this host reaches is part of the answer.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import psutil

from .. import flags, runner
from ..launch.kept import kept_for
from ..session import environment

WORKLOAD = "mlp:width=256,depth=2,input_dim=64"     # 85,002 parameters: 340 kB of gradient per step


def run(node_counts: list[int], bw: str, steps: int, cpus_per_node: str, workload: str, results_dir: str,
        phase: Callable[[str], None] = lambda text: None, fresh: bool = False) -> dict:
    """One run per node count (no calibration: the bench times gctestbed, not the links). Workers
    are forked by one fork server, as a sweep's are (launch/kept.py); ``fresh``: every node starts
    its own interpreter, on a network of each run's own."""
    rows, cpus = [], flags.build_spec(cpus_per_node=cpus_per_node).cpus_per_node
    with contextlib.nullcontext() if fresh else kept_for("bench scale") as kept:
        for n in node_counts:
            spec = flags.build_spec(nodes=str(n), bw=bw, steps=str(steps), workload=workload, calibrate=False,
                                    cpus_per_node=cpus_per_node, results_dir=results_dir)
            phase(f"bench scale: {n} nodes")
            free = psutil.virtual_memory().available
            t0 = time.monotonic()
            summary = runner.run(spec, kept=kept, fresh=fresh)
            rows.append(_row(n, summary, time.monotonic() - t0, free))
    return {"machine": environment(), "bw": bw, "steps": steps, "workload": workload, "fork_server": not fresh,
            "cpus_per_node": cpus, "results_dir": results_dir, "rows": rows}


def _row(n: int, s, wall_s: float, free_before: int) -> dict:
    """The figures of one run, from its summary."""
    nodes = (s.cpu or {}).get("nodes") or []
    pss = [x["pss_bytes"] for x in nodes if x["pss_bytes"]]
    rss = [x["rss_bytes"] for x in nodes if x["rss_bytes"]]
    uss = [x["uss_bytes"] for x in nodes if x.get("uss_bytes")]
    p = s.phases or {}
    return {"nodes": n, "run_id": s.run_id, "status": s.status, "error": s.error, "wall_s": wall_s,
            "fixed_s": p.get("fixed_s"), "build_s": p.get("build_s"), "teardown_s": p.get("teardown_s"),
            "median_step_s": s.median_step_s, "busbw_bps": s.busbw_bps, "busbw_fraction": s.busbw_fraction_of_link,
            "pss_bytes": statistics.median(pss) if pss else None, "rss_bytes": statistics.median(rss) if rss else None,
            "uss_bytes": statistics.median(uss) if uss else None,
            "host_available_before_bytes": free_before}
