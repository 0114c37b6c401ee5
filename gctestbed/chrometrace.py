"""A trace as Chrome trace events: a run's timeline for a person to look at in Perfetto
(ui.perfetto.dev) or chrome://tracing.

The input is a trace dict (``trace.extract`` of a run in the store, or ``tracefile.load`` of a
file); the output is the Trace Event Format's JSON object: ``traceEvents``, ``displayTimeUnit``
and ``otherData`` (the run and its job). Times in the format are MICROseconds (``ts``, ``dur``);
the trace's are seconds.

One process per rank (``pid`` = the rank), named by ``process_name`` metadata. In it, thread 0
("training") holds each step, its forward and backward (``compute_s``) with the forward's part
first (``forward_s``; the sum of a method's micro-batches' forwards, which interleave with
backward), in serial mode the exchange after backward, the optimizer and local SGD's averaging
(``sync_s``); thread 1 + k holds
DDP's bucket k: when the hook got it (an instant at ``ready_s``), its encode (from ``start_s``,
``encode_s`` long), its collective (encode's end to decode's start; "push+pull" under ``--comm
ps``) and its decode (``decode_s`` long, ending at ``done_s``). A bucket has a thread of its own
because one bucket's collective runs while the next is encoded: on one thread they would overlap
without nesting, which the viewers draw wrongly.

Steps lie end to end per rank: each step starts at the wall time it was stored at (``t``) less
its ``step_s`` where every step of the trace has ``t`` (the ranks then share one clock, the
earliest step's start being 0), else at the sum of the rank's earlier ``step_s``. A bucket's times
count from its step's first forward, which the step's start stands for. A field that is null (a
run stored before the field existed) leaves its event out: nothing is invented.
"""

from __future__ import annotations

from typing import Any

US = 1e6                   # the format's microseconds per second of the trace
TRAINING_TID = 0           # the step's own thread; bucket k is thread BUCKET_TID + k
BUCKET_TID = 1


def events(trace: dict[str, Any]) -> dict[str, Any]:
    """The Chrome trace (the JSON object format) of ``trace``."""
    job = trace.get("job") or {}
    recorded = trace.get("recorded") or {}
    starts, clock = step_starts(trace)
    out: list[dict[str, Any]] = []
    for r in trace["ranks"]:
        rank = r["rank"]
        out += _meta(rank, "process_name", {"name": f"rank {rank}"}) + _meta(rank, "process_sort_index",
                                                                            {"sort_index": rank})
        out += _meta(rank, "thread_name", {"name": "training"}, TRAINING_TID)
        buckets: set[int] = set()
        for s, start in zip(r["steps"], starts[rank]):
            out += _step(s, start, rank, job)
            for b in s["buckets"]:
                buckets.add(b["bucket"])
                out += _bucket(b, s["step"], start, rank, job)
        for k in sorted(buckets):
            out += _meta(rank, "thread_name", {"name": f"bucket {k}"}, BUCKET_TID + k)
            out += _meta(rank, "thread_sort_index", {"sort_index": BUCKET_TID + k}, BUCKET_TID + k)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"run_id": recorded.get("run_id"), "method": job.get("compressor"),
                          "workload": job.get("workload"), "nodes": job.get("nodes"), "mode": job.get("mode"),
                          "comm": job.get("comm"), "host": recorded.get("host"), "step_clock": clock}}


def step_starts(trace: dict[str, Any]) -> tuple[dict[int, list[float]], str]:
    """Each rank's step start times in seconds from the trace's origin, and which clock gave them:
    "stored" (each step's wall time ``t`` less its ``step_s``, one clock for every rank) or
    "step_s" (each rank's steps laid end to end from 0)."""
    steps = [s for r in trace["ranks"] for s in r["steps"]]
    if steps and all(s.get("t") is not None for s in steps):
        origin = min(s["t"] - s["step_s"] for s in steps)
        return {r["rank"]: [s["t"] - s["step_s"] - origin for s in r["steps"]] for r in trace["ranks"]}, "stored"
    starts = {}
    for r in trace["ranks"]:
        at, starts[r["rank"]] = 0.0, []
        for s in r["steps"]:
            starts[r["rank"]].append(at)
            at += s["step_s"]
    return starts, "step_s"


def _meta(pid: int, name: str, args: dict, tid: int = 0) -> list[dict[str, Any]]:
    return [{"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}]


def _span(name: str, cat: str, start: float, seconds: float, pid: int, tid: int, args: dict) -> list[dict[str, Any]]:
    """A complete event from ``start`` for ``seconds`` (both in seconds; written in microseconds)."""
    ts = round(start * US, 3)
    return [{"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": round(round((start + seconds) * US, 3) - ts, 3),
             "pid": pid, "tid": tid, "args": args}]


def _known(*values) -> bool:
    return all(v is not None for v in values)


def _step(s: dict[str, Any], start: float, rank: int, job: dict) -> list[dict[str, Any]]:
    """A step's span and, inside it, forward and backward, serial mode's exchange, the optimizer
    and the averaging, each where its field is known."""
    step, total = s["step"], s["step_s"]
    sync = s.get("sync_s") or 0.0
    out = _span(f"step {step}", "step", start, total, rank, TRAINING_TID,
                {"step": step, **{k: s.get(k) for k in ("step_s", "comm_s", "encode_s", "decode_s")},
                 "buckets": len(s["buckets"])})
    if s.get("compute_s") is not None:
        out += _span("forward+backward", "compute", start, s["compute_s"], rank, TRAINING_TID,
                     {"step": step, "compute_s": s["compute_s"]})
        if s.get("forward_s") is not None:    # a method's micro-batches interleave it with backward: their sum
            out += _span("forward", "compute", start, s["forward_s"], rank, TRAINING_TID,
                         {"step": step, "forward_s": s["forward_s"]})
    if s.get("optim_s") is not None:
        if job.get("mode") == "serial" and s.get("compute_s") is not None:
            out += _span("exchange", "comm", start + s["compute_s"], total - s["compute_s"] - s["optim_s"] - sync,
                         rank, TRAINING_TID, {"step": step})
        out += _span("optimizer", "compute", start + total - sync - s["optim_s"], s["optim_s"], rank, TRAINING_TID,
                     {"step": step, "optim_s": s["optim_s"]})
    if s.get("sync_s"):
        out += _span("averaging", "comm", start + total - sync, sync, rank, TRAINING_TID, {"step": step, "sync_s": sync})
    return out


def _bucket(b: dict[str, Any], step: int, start: float, rank: int, job: dict) -> list[dict[str, Any]]:
    """One bucket's exchange in a step that began at ``start``: ready, encode, collective, decode."""
    tid = BUCKET_TID + b["bucket"]
    args = {"step": step, "bucket": b["bucket"], "seq": b["seq"], "layout": b["layout"], "method": job.get("compressor"),
            "numel": b["numel"], "sent": b["sent"], "rounds": b["rounds"],
            "bytes": b["reduce_bytes"] + b["gather_bytes"], "reduce_bytes": b["reduce_bytes"],
            "gather_bytes": b["gather_bytes"]}
    ready, began, done = b.get("ready_s"), b.get("start_s"), b.get("done_s")
    encode, decode = b.get("encode_s"), b.get("decode_s")
    out: list[dict[str, Any]] = []
    if ready is not None:
        out.append({"name": "ready", "cat": "comm", "ph": "i", "s": "t", "ts": round((start + ready) * US, 3),
                    "pid": rank, "tid": tid, "args": args})
    if _known(began, encode):
        out += _span("encode", "comm", start + began, encode, rank, tid, args)
    if _known(began, encode, done, decode):
        out += _span("push+pull" if job.get("comm") == "ps" else "collective", "comm", start + began + encode,
                     (done - decode) - (began + encode), rank, tid, {**args, "payloads": b.get("payloads")})
    if _known(done, decode):
        out += _span("decode", "comm", start + done - decode, decode, rank, tid, args)
    return out
