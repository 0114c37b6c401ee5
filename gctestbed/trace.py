"""A run's compute and communication as a file a user can keep and share: the first half of replay.

A trace is what a finished run recorded, per rank and step, taken from the results store (the
Recorder wrote it; nothing is measured again): each step's time, compute (forward and backward),
optimizer, encode and decode seconds, and every bucket it exchanged with its elements, rounds,
collective calls and the bytes it reduced and gathered; the model's parameters in its order and
every bucket layout DDP formed; the job (method and options, workload, nodes, batch size, bucket
cap, timing mode) and where it was recorded (host, CPU, torch, device); each bucket also carries
when the hook got it (from the step's first forward) and its own encode and decode seconds (null
in runs stored before schema 13), and when its encoding began and its decoded result was
delivered (on the same clock) with what it put on the wire per round, dtypes and element counts
(null before schema 14); each step carries the wall time it was stored at. It is JSON, versioned
by FORMAT and VERSION; docs/replay.md says what each field holds and what version 2 still lacks
(forward time apart from backward).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sqlite3
import statistics
from typing import Any

from . import results, tracefile
from .spec import RunSpec, UserError
from .tracefile import FORMAT, VERSION, load as load_trace

STEP_TIMES = ("step_s", "compute_s", "forward_s", "optim_s", "encode_s", "decode_s", "comm_s", "sync_s", "optim_cpu_s")
# a bucket's CPU times: null where not recorded (a GPU; before schema 18)
BUCKET_CPU_TIMES = results.store.CPU_TIMES


def untraceable(spec: RunSpec) -> str | None:
    """Why a run of ``spec`` cannot be traced for replay, or None: a trace holds gctestbed's own
    workloads' compute, undilated, exchanged over the ring or parameter servers."""
    from . import workloads
    if spec.command:
        return "it runs your own program, whose compute gctestbed does not see"
    if spec.dilate != 1:
        return f"it is dilated x{spec.dilate:g}"
    if spec.comm not in workloads.replay.COMMS:
        return f"it exchanges with --comm {spec.comm}, which a replay does not"
    return None


def extract(conn: sqlite3.Connection, run_id: str, host_time: bool = False) -> dict[str, Any]:
    """The trace of a finished run in ``conn``; a run that did not end well, or that exchanged no
    bucket (a user's own command, local steps only), cannot be traced: one UserError. A dilated run
    only with ``host_time`` (its times are this host's, not its compute's: to look at, not to replay),
    which also leaves out the model's buffers where the store lacks them (before schema 17: a replay
    needs them, a timeline does not, and reading them builds the model again)."""
    run = results.find_run(conn, run_id)
    if run["status"] != "ok":
        raise UserError(f"run {run['run_id']} ended {run['status']}: only a run that ended well can be traced.")
    spec = RunSpec.from_json(run["spec"])
    if spec.dilate != 1 and not host_time:
        raise UserError(f"run {run['run_id']} was dilated x{spec.dilate:g}, so its recorded times are not its compute's: "
                        "trace the run whose compute it replayed.")
    env = json.loads(run["environment"] or "{}")
    exchanges = results.exchanges_of(conn, run["run_id"])
    if not exchanges:
        raise UserError(f"run {run['run_id']} exchanged no bucket through gctestbed's hook: there is nothing to trace.")
    if any(e["ready_s"] is None for e in exchanges):
        raise UserError(f"run {run['run_id']} was stored before its buckets' ready times were recorded (schema 13): "
                        "run the job again with this gctestbed and trace that run.")
    layouts = results.layouts_of(conn, run["run_id"])
    buffers, broadcast = _buffer_facts(conn, run["run_id"], spec, host_time)
    by_step: dict[tuple[int, int], list[dict]] = {}
    for e in exchanges:
        by_step.setdefault((e["rank"], e["step"]), []).append(e)
    ranks: dict[int, list[dict]] = {}
    for row in results.step_rows(conn, run["run_id"]):
        if row["rank"] >= spec.nodes:                 # a parameter server's rank: it has no compute to trace
            continue
        buckets = [{"seq": e["seq"], "bucket": e["bucket"], "layout": e["layout"], "numel": e["numel"],
                    "sent": e["sent"], "rounds": e["rounds"], "reduce_calls": e["reduce_calls"],
                    "gather_calls": e["gather_calls"], "reduce_bytes": e["payload_bytes"] - e["gather_bytes"],
                    "gather_bytes": e["gather_bytes"], "ready_s": e["ready_s"], "encode_s": e["encode_s"],
                    "decode_s": e["decode_s"], "start_s": e["start_s"], "done_s": e["done_s"],
                    **{k: e[k] for k in BUCKET_CPU_TIMES}, "payloads": e["payloads"]} for e in by_step.get((row["rank"], row["step"]), [])]
        ranks.setdefault(row["rank"], []).append(
            {"step": row["step"], "t": row["t"], **{k: row[k] for k in STEP_TIMES}, "buckets": buckets})
    first = layouts.get((0, 0))
    return {
        "format": FORMAT, "version": VERSION,
        "recorded": {"run_id": run["run_id"], "created_at": run["created_at"], "host": env.get("hostname"),
                     "cpu": env.get("cpu"), "cpus": env.get("cpus"), "torch": env.get("torch"),
                     "gctestbed": env.get("gctestbed"), "launcher": env.get("launcher"), "device": spec.device,
                     "backend": spec.backend},
        "job": {"compressor": spec.compressor, "compressor_options": spec.compressor_options,
                "workload": spec.workload, "workload_options": spec.workload_options, "nodes": spec.nodes,
                "batch_size": spec.batch_size, "bucket_cap_mb": spec.bucket_cap_mb, "mode": spec.mode,
                "comm": spec.comm, "comm_options": spec.comm_options, "optimizer": spec.optimizer,
                "bw_bps": spec.link.bw_bps, "latency_s": spec.link.latency_s, "steps": spec.steps,
                "dilate": spec.dilate},
        # DDP's first step sends the whole model as one bucket in the model's order (torch 2.13): its layout
        # is the parameter order; the layouts that follow are the buckets DDP rebuilt in backward's order
        "parameters": first,
        # the model's buffers (batch norm's statistics): DDP broadcasts them before every forward
        "buffers": buffers,
        # whether it did (a workload's buffers=local: not), so a replay of this trace does as it did
        "broadcast_buffers": broadcast,
        # per rank: its layout numbers are its own (a hook numbers layouts in the order its exchanges complete)
        "layouts": {str(r): {str(layout): params for (rank, layout), params in sorted(layouts.items()) if rank == r}
                    for r in sorted(ranks)},
        "ranks": [{"rank": r, "steps": steps} for r, steps in sorted(ranks.items())],
    }


# a run's settings that do not change what a trace of it holds: merged runs may differ in these alone
FREE = ("seed", "run_id", "results_dir", "eval_every", "timeout_s", "calibrate", "accept_miss")
# and what they must share of where they ran, beyond their specs (which hold the launcher, device and
# backend): one host, one torch
HOST = ("host", "cpu", "cpus", "torch")


def mergeable(specs: list[RunSpec], recorded: list[dict[str, Any]] | None = None) -> None:
    """One UserError unless the runs of ``specs`` are one job: the same in every setting but ``FREE``
    (the CPUs per node, kernels, faults and topology change the times a trace holds) and, given
    their traces' ``recorded``, on one host (``HOST``)."""
    first = {k: v for k, v in dataclasses.asdict(specs[0]).items() if k not in FREE}
    for i, spec in enumerate(specs[1:], 1):
        differ = sorted(k for k, v in dataclasses.asdict(spec).items() if k not in FREE and first.get(k) != v)
        if recorded:
            differ += [k for k in HOST if recorded[i].get(k) != recorded[0].get(k)]
        if differ:
            raise UserError(f"run {spec.run_id} differs from run {specs[0].run_id} in {', '.join(differ)}: a trace "
                            "merges runs of one job.")


def of_runs(runs: list[tuple[sqlite3.Connection, str | None]]) -> dict[str, Any]:
    """The trace of one run, or of several runs of one job (``mergeable``, then ``merge``): each
    ``(store, run id)``, the latest run of a store where the id is None, a run given twice taken once."""
    rows = list({(id(conn), row["run_id"]): (conn, row) for conn, r in runs
                 for row in [results.find_run(conn, r)]}.values())
    traces = [extract(conn, row["run_id"]) for conn, row in rows]
    mergeable([RunSpec.from_json(row["spec"]) for _, row in rows], [t["recorded"] for t in traces])
    return merge(traces)


def merge(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace from the traces of several runs of one job on one host (``of_runs`` holds them to
    ``mergeable`` first): per rank, step and bucket (DDP's index and parameters), the median of each
    time over the runs. The buckets' sizes and payloads are those of the run whose bytes sent are the
    median (all runs', for a method whose sizes do not vary); a bucket's start and end are rebuilt
    from the medians of its ready time, wait, encode, collective and decode, so they stay in order.
    Why: a replay reproduces its trace's compute, and one run's compute on a shared host sits tens
    of percent from another's (docs/replay.md, "Nine seeds"); measured against real runs, merged
    traces replayed no closer than single-run ones (docs/replay.md, "Single-run against merged
    traces"). One UserError where the runs did not exchange the same model, ranks, steps and buckets."""
    if len(traces) == 1:
        return traces[0]
    name = [t["recorded"].get("run_id") for t in traces]
    for t, run in zip(traces[1:], name[1:]):
        if t["parameters"] != traces[0]["parameters"] or [[s["step"] for s in r["steps"]] for r in t["ranks"]] != \
                [[s["step"] for s in r["steps"]] for r in traces[0]["ranks"]]:
            raise UserError(f"run {run} has another model, other ranks or other steps than run {name[0]}: a trace "
                            "merges runs of one job.")
    sent = [sum(b["reduce_bytes"] + b["gather_bytes"] for r in t["ranks"] for s in r["steps"] for b in s["buckets"])
            for t in traces]
    base = traces[sorted(range(len(traces)), key=lambda i: (sent[i], i))[(len(traces) - 1) // 2]]
    out = copy.deepcopy(base)
    for r, rank in enumerate(out["ranks"]):
        for k, step in enumerate(rank["steps"]):
            twins = [t["ranks"][r]["steps"][k] for t in traces]
            for key in STEP_TIMES:
                step[key] = _median_or_none([s.get(key) for s in twins])
            for b in step["buckets"]:
                same = [_bucket(t, r, s, b, base) for t, s in zip(traces, twins)]
                if any(x is None for x in same):
                    run = name[[x is None for x in same].index(True)]
                    raise UserError(f"run {run} exchanged other buckets than run {base['recorded'].get('run_id')} at "
                                    f"rank {rank['rank']} step {step['step']}: a trace merges runs of one job.")
                _merge_times(b, same)
    out["recorded"]["merged_from"] = name
    return out


def _merge_times(b: dict, same: list[dict]) -> None:
    """``b``'s times, the medians over ``same`` (one bucket in each run): its ready time, encode and
    decode, and its start and end rebuilt from the medians of the wait before encoding and of the
    collective between encoding and decoding (medians of sums are not sums of medians)."""
    for key in ("ready_s", "encode_s", "decode_s", *BUCKET_CPU_TIMES):
        b[key] = _median_or_none([x.get(key) for x in same])
    wait = _median_or_none([None if x.get("start_s") is None else x["start_s"] - x["ready_s"] for x in same])
    spans = [None if None in (x.get("done_s"), x.get("start_s"), x.get("encode_s"), x.get("decode_s"))
             else x["done_s"] - x["start_s"] - x["encode_s"] - x["decode_s"] for x in same]
    collective = _median_or_none(spans)
    b["start_s"] = None if wait is None or b["ready_s"] is None else b["ready_s"] + max(0.0, wait)
    b["done_s"] = None if None in (collective, b["start_s"], b["encode_s"], b["decode_s"]) else \
        b["start_s"] + b["encode_s"] + b["decode_s"] + max(0.0, collective)


def _bucket(trace: dict, r: int, step: dict, b: dict, base: dict) -> dict | None:
    """The bucket of ``step`` (rank position ``r`` of ``trace``) that is ``b`` of ``base``: DDP's
    index, and a layout of the same parameters (layout numbers are each run's own)."""
    want = base["layouts"][str(base["ranks"][r]["rank"])][str(b["layout"])]
    return next((x for x in step["buckets"] if x["bucket"] == b["bucket"]
                 and trace["layouts"][str(trace["ranks"][r]["rank"])][str(x["layout"])] == want), None)


def _median_or_none(values: list) -> float | None:
    """The median, or None where any run lacks the time (unlike ``_median``, which skips what is missing)."""
    return None if any(v is None for v in values) else statistics.median(values)


def describe(trace: dict[str, Any]) -> dict[str, Any]:
    """What a person wants to see of a trace first: the job, where it was recorded, and per rank
    the medians of its step times and bytes per step (steps after the first, where DDP builds buckets)."""
    ranks = []
    for r in trace["ranks"]:
        steps = [s for s in r["steps"] if s["step"] > 0] or r["steps"]
        med = {k: _median([s[k] for s in steps if s.get(k) is not None]) for k in STEP_TIMES}
        med["buckets"] = _median([len(s["buckets"]) for s in steps])
        med["bytes"] = _median([sum(b["reduce_bytes"] + b["gather_bytes"] for b in s["buckets"]) for s in steps])
        ranks.append({"rank": r["rank"], "steps": len(r["steps"]), **med})
    params = trace["parameters"] or []
    return {"job": trace["job"], "recorded": trace["recorded"], "version": trace["version"],
            "parameters": len(params), "elements": sum(math.prod(shape) for _, shape in params),
            "layouts": len(trace["layouts"]["0"]), "ranks": ranks}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _replayed(spec: RunSpec) -> dict | None:
    """A replay's own trace, read once for what this trace copies from it; None for other runs or
    where it can no longer be read."""
    if spec.workload != "replay":
        return None
    try:
        return load_trace(spec.workload_options["trace"])
    except UserError:
        return None


def _buffer_facts(conn: sqlite3.Connection, run_id: str, spec: RunSpec, host_time: bool) -> tuple[list[list], bool]:
    """The model's buffers and whether DDP broadcast them: as the first worker recorded them from
    its wrapped model (schema 17; a user's own model's too); for an older run, worked out from its
    spec (a replay's own trace read once; a built-in model built again, except for host time)."""
    rows = [r for r in results.node_rows(conn, run_id) if r["buffers"]]
    if rows:
        own = json.loads(rows[0]["buffers"])
        return own["buffers"], own["broadcast"]
    replayed = _replayed(spec)
    return ([] if host_time else _buffers(spec, replayed)), _sends_buffers(spec, replayed)


def _sends_buffers(spec: RunSpec, replayed: dict | None = None) -> bool:
    """Whether the run's DDP broadcast its buffers: a replay did as its own trace's run did."""
    from . import workloads
    if spec.workload == "replay":
        replayed = replayed or _replayed(spec)
        return workloads.replay.sends_buffers(replayed) if replayed else True
    return workloads.images.broadcasts(spec.workload_options)


def _buffers(spec: RunSpec, replayed: dict | None) -> list[list]:
    """``[name, shape, dtype]`` of each buffer of the run's model, read from the model built again
    (a built-in workload; a replay's from its own trace); [] where it cannot be known (a user's
    own model, a trace without them)."""
    from . import workloads
    if spec.workload == "replay":
        return replayed.get("buffers", []) if replayed else []
    if spec.workload not in workloads.names():
        return []
    model = workloads.build(spec.workload, spec.workload_options, spec.seed, 0, spec.batch_size, spec.nodes).model
    return tracefile.buffer_layout(model.named_buffers())
