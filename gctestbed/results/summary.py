"""A run's figures from its stored rows: the typed RunSummary (``show --json`` prints it), the
method's contract judged on the run's exchanges, and what each fault did.

Everything here is computed from rows the store's functions read (results.store); nothing here
writes SQL. Analysis reads only the store, never logs, so a summary can be rebuilt at any time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sqlite3
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from .. import hostcpu
from ..spec import LOCAL_COMMS, RunSpec
from . import store


def contract_check(conn: sqlite3.Connection, run_id: str, spec: RunSpec, model_numel: int | None = None,
                   model_order: list[str] | None = None, exchanges: list[dict] | None = None) -> dict | None:
    """The run's steps against its method's contract (gctestbed.contracts; over the ring, or
    pushed to parameter servers), or None for a run that recorded no exchanges (a user's script
    that never installed gctestbed's hook). ``exchanges``: the run's, where the caller has read them."""
    from .. import contracts
    exchanges = store.exchanges_of(conn, run_id) if exchanges is None else exchanges
    if not exchanges:
        return None
    steps = store.tx_of(conn, run_id)
    if spec.comm == "ps":
        server_steps = store.server_steps_of(conn, run_id)
        return contracts.judge_ps(spec.compressor, spec.compressor_options, spec.comm_options, spec.nodes, steps,
                                  exchanges, store.layouts_of(conn, run_id), server_steps, model_numel, model_order)
    return contracts.judge(spec.compressor, spec.compressor_options, spec.nodes, steps, exchanges,
                           store.layouts_of(conn, run_id), model_numel)


def fault_effect(spec: RunSpec, fault: sqlite3.Row, steps: dict[int, list[sqlite3.Row]]) -> dict[str, Any]:
    """What a fault did, from the step records: the steps that ran while it was on, and the median
    step time (and bytes the faulted node sent: retransmissions show there) during it against the
    median of the other steps (step 0, with DDP's start-up traffic, left out of both)."""
    planned = spec.faults[fault["idx"]] if fault["idx"] < len(spec.faults) else None
    out = {"fault": planned.describe() if planned else f"{fault['kind']} on node {fault['node']}",
           "kind": fault["kind"], "node": fault["node"], "pct": fault["pct"], "started": fault["started"],
           "ended": fault["ended"], "steps": [], "median_step_s_during": None, "median_step_s_outside": None,
           "median_tx_bytes_during": None, "median_tx_bytes_outside": None}
    if fault["started"] is None:
        return out
    end = fault["ended"] if fault["ended"] is not None else math.inf
    during, outside, tx_during, tx_outside = [], [], [], []
    for step, rows in sorted(steps.items()):
        begun, finished = min(r["t"] - r["step_s"] for r in rows), max(r["t"] for r in rows)
        hit = begun <= end and finished >= fault["started"]
        if hit:
            out["steps"].append(step)
        if step > 0:
            (during if hit else outside).append(max(r["step_s"] for r in rows))
            (tx_during if hit else tx_outside).extend(r["tx_bytes"] for r in rows if r["rank"] == fault["node"])
    out["median_step_s_during"], out["median_step_s_outside"] = _median(during), _median(outside)
    out["median_tx_bytes_during"], out["median_tx_bytes_outside"] = _median(tx_during), _median(tx_outside)
    return out


# The durations a step row holds. A dilated run (--dilate K) stores them as the host measured them
# (host seconds, K times the emulated ones); every figure is computed from ``emulated`` rows.
STEP_TIMES = ("step_s", "compute_s", "optim_s", "comm_s", "encode_s", "decode_s", "push_s", "pull_s", "sync_s",
              "behind_s")

# A node counts as saturated when its CPU time over its wall time reaches this share of the CPUs it
# had (its --cpus-per-node cap), or the nodes together this share of the host's cores: the host,
# not the link, then bounds what the run measured (see _host_bound).
HOST_BOUND_SHARE = 0.9
# The host's own counters (hostcpu), where the run sampled them: its cores saturated for at least
# this share of the measured steps' time paced the steps themselves, whatever the nodes' own times say
HOST_SATURATED_SHARE = 0.5
# The hypervisor's share of the host's CPU time (steal, in the host's counters) over the measured
# steps at which a VM host may have run slower than itself: a vCPU stolen when it had packets to
# forward or a timer to fire holds the links idle, however idle the host looks. Against their twin
# runs of the same cell (the fourteenth scale measurement, docs/replay.md): 20.6 % stolen read
# 12.7 % slower, 16.2 % 5.8 %, 8.2-10 % 1.6-3.6 %, 5.1 % not slower. Deliberately low: it flags
# runs that may be a few per cent slow, and a cell run twice keeps its clean twin (model.per_cell)
HOST_STOLEN_SHARE = 0.05


def emulated(spec: RunSpec, rows: Iterable) -> list:
    """Step rows (or any rows with some of STEP_TIMES) in the run's emulated units: every duration /
    ``spec.dilate``; bytes, counts, loss and the clock ``t`` as stored. The one place a dilated
    run's times are converted (the store keeps host seconds); an undilated run's rows come back as
    they are."""
    if spec.dilate == 1:
        return list(rows)
    return [{**dict(r), **{f: emulated_s(spec, r[f]) for f in STEP_TIMES if f in r.keys()}} for r in rows]


def emulated_s(spec: RunSpec, seconds: float | None) -> float | None:
    """One duration the run measured on this host, in its emulated units (host seconds / dilate)."""
    return None if seconds is None else seconds / spec.dilate


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


@dataclass(frozen=True)
class RunSummary:
    """The figures of one run, from its stored rows only (``show --json`` prints ``to_dict()``;
    docs/running.md says what each field means). Step figures are medians over complete steps;
    bytes, calls and buckets per step are means (amortised) where not every step sends, and
    ``per_step_stat`` says which."""

    run_id: str
    status: str
    error: str | None
    compressor: str
    compressor_options: dict[str, Any]
    kernels: str
    mode: str
    workload: str
    workload_options: dict[str, Any]
    replayed: str | None          # a replay's trace and options (docs/replay.md); None for a real model
    batch_size: int
    nodes: int
    topology: str | None
    bw_bps: int
    latency_s: float
    steps: int
    steps_recorded: int
    median_step_s: float | None
    samples_per_s: float | None
    median_compute_s: float | None
    median_comm_s: float | None
    median_encode_s: float | None
    median_decode_s: float | None
    median_optim_s: float | None
    wire_bytes_per_step: float | None
    payload_bytes_per_step: float | None
    gather_bytes_per_step: float | None
    expected_tx_bytes_per_step: float | None
    reduce_calls_per_step: float | None
    gather_calls_per_step: float | None
    tail_tx_bytes_per_step: float | None
    buckets_per_step: float | None
    sent_fraction: float | None
    contract: dict[str, Any] | None
    busbw_bps: float | None
    bottleneck_bps: int
    busbw_fraction_of_link: float | None
    final_loss: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    eval_samples: int | None
    params_identical: bool | None
    latency_impl: str | None
    environment: dict[str, Any]
    calibration: list[dict[str, Any]]
    calibration_missed: bool
    faults: list[dict[str, Any]]
    created_at: float
    finished_at: float | None
    comm: str = "allreduce"                  # how the workers met (--comm) and its options
    comm_options: dict[str, Any] = field(default_factory=dict)
    median_push_s: float | None = None       # parameter servers: the workers' pushes and pulls per step
    median_pull_s: float | None = None
    median_sync_s: float | None = None       # local SGD, DiLoCo: averaging time, over the steps that averaged
    servers: list[dict[str, Any]] = field(default_factory=list)   # each server's per-step figures
    dilate: float = 1.0                      # --dilate K: every time above is host seconds / K, every rate x K
    host_bound: bool | None = None           # whether the nodes' CPUs were near saturation (see _host_bound;
    host_bound_reason: str | None = None     # None: no CPU figures stored), and why
    bottleneck: str | None = None            # parameter servers: the link or phase that bounds a step
    amortised: dict[str, Any] | None = None  # local SGD, DiLoCo: means over whole periods (see _amortised)
    # the median over steps of when the step's first bucket was ready on its latest rank, from the step's
    # first forward: no exchange can start earlier (the performance model's overlap term); None unrecorded
    median_first_ready_s: float | None = None
    # a replay: the median over steps of the latest lateness of any rank's hand-over past its recorded
    # moment, and whether that is over BEHIND_SHARE of the step (the host, not the link, set the time)
    median_behind_s: float | None = None
    host_behind: bool | None = None
    cpu: dict[str, Any] | None = None        # each node's CPU time against wall time, the cap, contention (see _cpu)
    phases: dict[str, Any] | None = None     # where the run's wall time went, and its fixed cost (see _phases)
    per_step_stat: str = "median"            # what the bytes, calls and buckets per step are: "median" over
                                             # steps, or "mean" where not every step sends (see _sends_every_step)
    counters_error: str | None = None        # why the qdisc statistics at the end could not be read (none stored)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _identical(nodes: list) -> bool | None:
    """Whether every worker's parameters hashed alike (servers hold no model)."""
    if not nodes:
        return None
    return len({r["param_sha256"] for r in nodes}) == 1 and all(r["param_sha256"] for r in nodes)


def _servers(conn: sqlite3.Connection, run_id: str, spec: RunSpec, measured: list[int]) -> list[dict[str, Any]]:
    """Each parameter server's medians over the measured steps, and its run totals."""
    out = []
    for k in range(spec.servers):
        rows = store.server_steps_of(conn, run_id, spec.nodes + k)
        picked = [r for r in rows if r["step"] in measured] or rows
        out.append({"server": k, "rank": spec.nodes + k, "steps": len(rows),
                    **{f"median_{f}": _median(emulated_s(spec, r[f]) if f.endswith("_s") else r[f] for r in picked)
                       for f in store.SERVER_STEP_FIELDS},
                    "total_push_bytes": sum(r["push_bytes"] for r in rows), "total_pull_bytes": sum(r["pull_bytes"] for r in rows),
                    "total_tx_bytes": sum(r["tx_bytes"] or 0 for r in rows), "total_rx_bytes": sum(r["rx_bytes"] or 0 for r in rows)})
    return out


def _ps_bottleneck(spec: RunSpec, per_step: list, servers: list[dict]) -> str | None:
    """Which link or phase bounds a parameter-server step: each link's median bytes per step at its
    shaped rate, against the servers' summing time."""
    net = spec.network()
    candidates = []
    for rank in range(spec.nodes):            # each worker's pushes through its own uplink (a topology may differ)
        push = _median(r["expected_tx_bytes"] for rs in per_step for r in rs if r["rank"] == rank)
        if push:
            candidates.append((push * 8 / net.nodes[rank].hop.ab.rate_bps,
                               f"worker {rank}'s uplink (pushes, {push / 1e6:.3g} MB per step)"))
    for s in servers:
        hop = net.nodes[s["rank"]].hop
        if s["median_push_bytes"]:
            candidates.append((s["median_push_bytes"] * 8 / hop.ba.rate_bps,
                               f"server {s['server']}'s downlink ({spec.nodes} workers' pushes, {s['median_push_bytes'] / 1e6:.3g} MB per step)"))
        if s["median_pull_bytes"]:
            candidates.append((s["median_pull_bytes"] * 8 / hop.ab.rate_bps,
                               f"server {s['server']}'s uplink (pulls to {spec.nodes} workers, {s['median_pull_bytes'] / 1e6:.3g} MB per step)"))
        if s["median_sum_s"]:
            candidates.append((s["median_sum_s"], f"server {s['server']}'s summing"))
    if not candidates:
        return None
    seconds, where = max(candidates)
    return f"{where}: {seconds:.3g} s per step at the shaped rate"


def _whole_periods(per_step: list) -> list:
    """Local SGD's and DiLoCo's measured steps from the step after the first average to the last
    (every measured step if fewer than two averaged): whole periods, each with one average."""
    averaged = [i for i, rs in enumerate(per_step) if any(r["sync_s"] for r in rs)]
    return per_step[averaged[0] + 1:averaged[-1] + 1] if len(averaged) >= 2 else per_step


def _sends_every_step(spec: RunSpec, per_step: list) -> bool:
    """Whether the run exchanged on every measured step. Local SGD and DiLoCo do not (they average
    every few steps), nor does a run in which the accounting says no rank sent anything on some
    steps but not on others (a method that skips steps); a run that never sent counts as every
    step alike."""
    if spec.comm in LOCAL_COMMS:
        return False
    sent = [any(r["expected_tx_bytes"] for r in rs) for rs in per_step
            if any(r["expected_tx_bytes"] is not None for r in rs)]
    return all(sent) or not any(sent)


def _amortised(per_step: list) -> dict[str, Any]:
    """Local SGD and DiLoCo exchange only on the steps that average, so their median step is a
    local one that sends nothing: step time, bytes and collectives are compared as means instead,
    with the share of steps that averaged. The means are over whole periods, from the step after
    the first average to the last: before it the workers have not met since they started, and the
    first collective waits for the slowest one's start (every measured step if fewer than two
    averaged)."""
    per_step = _whole_periods(per_step)
    return {"step_s": _mean(max(r["step_s"] for r in rs) for rs in per_step),
            "expected_tx_bytes": _mean(_mean(r["expected_tx_bytes"] or 0 for r in rs) for rs in per_step),
            "reduce_calls": _mean(_mean(r["reduce_calls"] or 0 for r in rs) for rs in per_step),
            "averaged_share": _mean(float(any(r["sync_s"] for r in rs)) for rs in per_step),
            "steps": len(per_step)}


def _cpu(spec: RunSpec, nodes: list, env: dict, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """How the nodes shared this host's CPUs (and memory): the cap (--cpus-per-node, 0 for
    none), whether more nodes than cores ran uncapped (then compute times depend on the
    scheduler), the CPUs the workers were allowed in all (``workers_cpus``: each its cap, or one
    uncapped), each node's CPU time over its wall time and its memory as the node measured them,
    the kernel's throttling counters of each node's cgroup where there were any, and the host's
    own CPU over ``window`` (the measured steps, in host seconds; ``host``: hostcpu.over, None
    where the run took no samples or too few; ``host_sampled``: whether the runner sampled it)."""
    cores, cap = env.get("cpus"), spec.cpus_per_node
    per_node = [{"rank": r["rank"], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                 "cpu_share": r["cpu_s"] / r["wall_s"] if r["cpu_s"] is not None and r["wall_s"] else None,
                 "rss_bytes": r["rss_bytes"], "pss_bytes": r["pss_bytes"], "uss_bytes": r["uss_bytes"]}
                for r in nodes]
    workers = round(spec.nodes * (cap or 1.0), 6)
    return {"cpus_per_node": cap, "host_cpus": cores, "workers_cpus": workers,
            "contended": bool(cores and not cap and workers + spec.servers > cores), "nodes": per_node,
            "cgroups": (env.get("qdisc_stats") or {}).get("cpu_shares"),
            "host": hostcpu.over(env.get("host_cpu"), *window) if window else None,
            "host_sampled": "host_cpu" in env}


def _first_ready(spec: RunSpec, exchanges: list[dict], measured: list[int]) -> float | None:
    """When the measured steps' first bucket was ready: per step the latest rank's (a ring's first
    exchange waits for every rank's), the median over the steps that have every rank's, in
    emulated seconds; None when none has. The latest of many ranks, where compute is a median over
    ranks: the larger the node count, the more it leans late."""
    ready: dict[tuple[int, int], float] = {}
    for e in exchanges:
        if e["ready_s"] is not None:
            key = (e["rank"], e["step"])
            ready[key] = min(ready.get(key, e["ready_s"]), e["ready_s"])
    per_step = [[ready.get((rank, step)) for rank in range(spec.nodes)] for step in measured]
    return emulated_s(spec, _median(max(rs) for rs in per_step if None not in rs))


def _window(host_rows: list, measured: list[int]) -> tuple[float, float] | None:
    """The measured steps' span in host seconds: from the earliest start of the first (a row's
    end, ``t``, less its step time) to the latest end of the last."""
    if not measured:
        return None
    first = [r["t"] - r["step_s"] for r in host_rows if r["step"] == measured[0]]
    last = [r["t"] for r in host_rows if r["step"] == measured[-1]]
    return (min(first), max(last)) if first and last else None


def _host_bound(cpu: dict) -> tuple[bool | None, str | None]:
    """Whether this host's CPUs, not the shaped links, bounded the run: the host's cores saturated
    (hostcpu.SATURATED busy, the kernel's own work included) for HOST_SATURATED_SHARE of the
    measured steps' time, or HOST_STOLEN_SHARE of its CPU time taken by a hypervisor, or a node
    whose CPU time over its wall time reached HOST_BOUND_SHARE of its --cpus-per-node cap. A run
    that took no samples of the host (stored before they were taken, or run on other hosts by
    ``gctestbed node``) is judged instead by the nodes' CPU times
    together against that share of the host's cores; a run whose samples cover too little of its
    measured steps (hostcpu.over) gets no host figure and no such fallback. The nodes'
    shares are over each node's whole life (start-up included, which runs at about one CPU where a
    node starts an interpreter of its own: the environment's ``shaping.workers``; a forked node
    starts with its imports done), so a short run reads high rather than low. None when there is
    no figure."""
    shares = [(n["rank"], n["cpu_share"]) for n in cpu["nodes"] if n["cpu_share"] is not None]
    host, sampled = cpu.get("host"), cpu.get("host_sampled")
    if not shares and host is None:
        return None, None
    reasons = []
    if host is not None and host["saturated_share"] >= HOST_SATURATED_SHARE:
        reasons.append(f"the host's cores were saturated (at least {hostcpu.SATURATED:.0%} busy) for "
                       f"{host['saturated_share']:.0%} of the measured steps' {host['window_s']:.1f} s on this host, "
                       f"{host['system'] + host['irq']:.0%} of their time in the kernel")
    stolen = (host or {}).get("steal") or 0.0           # samples written without the column read none
    if stolen >= HOST_STOLEN_SHARE:
        reasons.append(f"the hypervisor took {stolen:.0%} of this host's CPU time (steal) through the measured "
                       f"steps (at least {HOST_STOLEN_SHARE:.0%}): the host may have run slower than itself")
    if cpu["cpus_per_node"]:
        cap = cpu["cpus_per_node"]
        kernel = cpu.get("cgroups") or {}
        for rank, share in shares:
            if share >= HOST_BOUND_SHARE * cap:
                k = kernel.get(str(rank))
                throttled = f", throttled in {k['throttled_periods']} of {k['periods']} periods" if k and k["periods"] else ""
                reasons.append(f"node {rank} used {share:.2f} of its {cap:g} CPUs (at least {HOST_BOUND_SHARE:.0%}){throttled}")
    total, cores = sum(share for _, share in shares), cpu["host_cpus"]
    if sampled and host is None and not reasons:
        return None, None                   # sampled over too short a span: no figure either way
    if not sampled and cores and total >= HOST_BOUND_SHARE * cores:
        reasons.append(f"the nodes together used {total:.2f} of the host's {cores} cores (at least {HOST_BOUND_SHARE:.0%})")
    if not reasons:
        return False, None
    return True, "; ".join(reasons) + ": the host's CPU, not the link, may have set the step time"


def _oversubscribed(spec: RunSpec, cpu: dict) -> tuple[bool | None, str | None]:
    """Whether a replay whose workers take their CPU by design (spun compute, a mixed run's real
    ranks) were capped at more CPUs in all than the host has: each worker's --cpus-per-node (one
    CPU uncapped) added up against the host's cores (servers, which replay no compute, left out).
    Then not every worker could run as fast as it was recorded, and the host may have set the step
    time. Their measured CPU use cannot tell (they fill their CPUs as the recorded nodes did), so
    None, not False, where they fit: nothing here rules the host out."""
    cores, cap, workers = cpu["host_cpus"], cpu["cpus_per_node"], cpu["workers_cpus"]
    if not cores or workers <= cores:
        return None, None
    capped = f"capped at {cap:g} CPU each" if cap else "uncapped (1 CPU each at least)"
    return True, (f"{spec.nodes} workers {capped} take {workers:g} CPUs, and this host has {cores}: they "
                  "could not all run as fast as they were recorded, so the host's CPU, not the link, may have set the "
                  "step time (a spin on the wall clock, clock=wall, ends on time and shows it as behind_s instead)")


def _phases(env: dict, rows: list) -> dict[str, Any] | None:
    """The seconds each phase of the run took as its runner timed them (building the network,
    calibrating, the nodes from start to exit, teardown), rank 0's steps summed (``steps_s``),
    and the fixed cost: the run's wall time beyond its own steps and calibration (``fixed_s``:
    starting interpreters and process groups, evaluation, building and removing the network).
    None for runs stored before runs timed them. ``gctestbed node`` runs are timed on rank 0's
    host, with teardown (unshaping, after the store's last write) as 0."""
    phases = env.get("phases")
    if not phases:
        return None
    total = sum(phases.values())
    steps = sum(r["step_s"] for r in rows if r["rank"] == 0)
    return {**phases, "total_s": total, "steps_s": steps, "fixed_s": total - steps - phases.get("calibrate_s", 0.0)}


# a replay whose median step handed a gradient over later than this share of the step behind its
# recorded moment measured the host, not the recording: its step times say so (docs/replay.md)
BEHIND_SHARE = 0.02


def summarize(conn: sqlite3.Connection, run: sqlite3.Row) -> RunSummary:
    """The figures of one run, from its stored rows only.

    Step figures are medians over steps, leaving out step 0 (DDP builds its buckets there) when
    there are later steps. Bytes, calls and buckets per step are means instead where not every
    step sends (local SGD and DiLoCo over whole periods, see _whole_periods; a method that skips
    steps over the measured steps): their median step is one that sends nothing, 0 bytes, which
    is not what the method costs. Bus bandwidth follows nccl-tests: the bytes each node must send for a
    ring all-reduce of the payload, 2(n-1)/n of it, over the measured communication time.
    """
    spec = RunSpec.from_json(run["spec"])
    host_rows = store.step_rows(conn, run["run_id"])
    rows = emulated(spec, host_rows)
    done = {}
    for r in rows:
        done.setdefault(r["step"], []).append(r)
    complete = sorted(s for s, rs in done.items() if len(rs) == spec.nodes)
    measured = [s for s in complete if s > 0] or complete
    per_step = [done[s] for s in measured]
    step_s = _median(max(r["step_s"] for r in rs) for rs in per_step)
    n = spec.nodes
    busbw = _median(r["payload_bytes"] * 8 * 2 * (n - 1) / n / r["comm_s"]                # the ring's figure only
                    for rs in per_step for r in rs if n > 1 and r["comm_s"] and r["payload_bytes"]) \
        if spec.comm == "allreduce" else None
    last = done[complete[-1]] if complete else []
    net = spec.network()
    bottleneck = min(d.rate_bps for hop in [n.hop for n in net.nodes] + [t.hop for t in net.trunks]
                     for d in (hop.ab, hop.ba))
    nodes = store.node_rows(conn, run["run_id"])
    calibration = store.calibrations_of(conn, run["run_id"])
    env = json.loads(run["environment"] or "{}")
    faults = [fault_effect(spec, f, done) for f in store.fault_rows(conn, run["run_id"])]
    # read once, for the contract and the ready times (the model's; local steps have neither)
    exchanges = store.exchanges_of(conn, run["run_id"]) if spec.comm in ("allreduce", "ps") else []
    contract = contract_check(conn, run["run_id"], spec, exchanges=exchanges) if exchanges else None
    servers = _servers(conn, run["run_id"], spec, measured)
    every = _sends_every_step(spec, per_step)       # else bytes and calls per step are means (amortised)
    per_step_stat, window = ("median", per_step) if every else \
        ("mean", _whole_periods(per_step) if spec.comm in LOCAL_COMMS else per_step)
    stat = _median if every else _mean
    cpu = _cpu(spec, nodes, env, _window(host_rows, measured))
    # a replay that waits without the CPU (compute=sleep) should leave it idle: near saturation, the host
    # was the bottleneck. A spun replay's compute, or a mixed run's real ranks, take the CPU by design: only
    # whether its workers fit the host's cores. A real run measures the host itself: no figure
    sleeps = spec.workload_options.get("compute") == "sleep" and not int(spec.workload_options.get("real") or 0)
    host_bound, host_bound_reason = (None, None) if spec.workload != "replay" else \
        _host_bound(cpu) if sleeps else _oversubscribed(spec, cpu)
    behind = _median(max((r["behind_s"] for r in rs if r["behind_s"] is not None), default=None)
                     for rs in per_step) if spec.workload == "replay" else None    # a mixed run's real ranks have none
    return RunSummary(
        dilate=spec.dilate, host_bound=host_bound, host_bound_reason=host_bound_reason,
        median_behind_s=behind, host_behind=behind > BEHIND_SHARE * step_s if behind is not None and step_s else None,
        comm=spec.comm, comm_options=spec.comm_options, servers=servers,
        median_push_s=_median(r["push_s"] for rs in per_step for r in rs if r["push_s"] is not None),
        median_pull_s=_median(r["pull_s"] for rs in per_step for r in rs if r["pull_s"] is not None),
        median_sync_s=_median(r["sync_s"] for rs in per_step for r in rs if r["sync_s"]),
        bottleneck=_ps_bottleneck(spec, per_step, servers) if servers else None,
        amortised=_amortised(per_step) if spec.comm in LOCAL_COMMS and per_step else None,
        median_first_ready_s=_first_ready(spec, exchanges, measured),
        cpu=cpu,
        phases=_phases(env, host_rows),           # the runner's wall time on this host: host seconds
        counters_error=env.get("counters_error"),
        run_id=run["run_id"],
        status=run["status"],
        error=run["error"],
        compressor=spec.compressor,
        compressor_options=spec.compressor_options,
        kernels=spec.kernels,
        mode=spec.mode,
        workload=spec.workload,
        workload_options=spec.workload_options,
        replayed=replayed(spec),
        batch_size=spec.batch_size,
        nodes=n,
        topology=spec.topology.name if spec.topology else None,
        bw_bps=spec.link.bw_bps,
        latency_s=spec.link.latency_s,
        steps=spec.steps,
        steps_recorded=len(complete),
        median_step_s=step_s,
        samples_per_s=n * spec.batch_size / step_s if step_s else None,
        median_compute_s=_median(r["compute_s"] for rs in per_step for r in rs),
        median_comm_s=_median(r["comm_s"] for rs in per_step for r in rs),
        median_encode_s=_median(r["encode_s"] for rs in per_step for r in rs),
        median_decode_s=_median(r["decode_s"] for rs in per_step for r in rs),
        median_optim_s=_median(r["optim_s"] for rs in per_step for r in rs),
        per_step_stat=per_step_stat,
        wire_bytes_per_step=stat(_mean(r["tx_bytes"] for r in rs) for rs in window),
        payload_bytes_per_step=stat(r["payload_bytes"] for rs in window for r in rs),
        gather_bytes_per_step=stat(r["gather_bytes"] for rs in window for r in rs),
        expected_tx_bytes_per_step=stat(r["expected_tx_bytes"] for rs in window for r in rs),
        reduce_calls_per_step=stat(r["reduce_calls"] for rs in window for r in rs),
        gather_calls_per_step=stat(r["gather_calls"] for rs in window for r in rs),
        tail_tx_bytes_per_step=stat(r["tail_tx_bytes"] for rs in window for r in rs),
        buckets_per_step=stat(r["buckets"] for rs in window for r in rs),
        sent_fraction=contract["sent_fraction"] if contract else None,
        contract=contract,
        busbw_bps=busbw,
        bottleneck_bps=bottleneck,
        busbw_fraction_of_link=busbw / bottleneck if busbw else None,
        final_loss=_mean(r["loss"] for r in last),
        eval_loss=nodes[0]["eval_loss"] if nodes else None,
        eval_accuracy=nodes[0]["eval_accuracy"] if nodes else None,
        eval_samples=nodes[0]["eval_samples"] if nodes else None,
        params_identical=_identical([r for r in nodes if r["role"] != "server"]),
        latency_impl=env.get("shaping", {}).get("latency_impl"),
        environment={k: v for k, v in env.items() if k != "host_cpu"},     # the host's samples: read into cpu["host"]
        calibration=calibration,
        calibration_missed=any(c["miss"] for c in calibration),
        faults=faults,
        created_at=run["created_at"],
        finished_at=run["finished_at"],
    )


def replayed(spec: RunSpec) -> str | None:
    """What a replayed run replayed, for its labels: the trace's file name and how it was replayed."""
    if spec.workload != "replay":
        return None
    o = spec.workload_options
    scale = f", scale={o['scale']:g}" if o.get("scale", 1.0) != 1.0 else ""
    real = f", real={o['real']}" if o.get("real") else ""
    optim = ", optim=recorded" if o.get("optim") == "recorded" else ""
    return f"{os.path.basename(o['trace'])} (compute={o['compute']}, codec={o.get('codec', 'real')}{optim}{scale}{real})"
