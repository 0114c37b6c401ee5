"""A torch.profiler trace of a user's own DDP job, turned into a gctestbed trace to replay.

A job profiled where its model runs (``torch.profiler.profile(record_shapes=True)``, one Chrome
trace per rank from ``export_chrome_trace``) holds what a replay needs of it: each step's
``DistributedDataParallel.forward`` (where a step starts), every ``c10d::allreduce_`` DDP issued
in backward (when a bucket was ready, and how many elements it held), the ``gloo:all_reduce`` the
process group then ran (its dtype, and when it finished), the ``c10d::broadcast_`` of the model's
buffers in a forward, and the optimizer's ``Optimizer.step#...``. It does not hold the model's
parameters, so the trace gets one parameter per bucket, of the bucket's size: a replay's DDP then
forms the profiled buckets (``bucket_cap_mb`` set so that each parameter closes a bucket of its
own) and sends the profiled bytes when backward released them. The method is DDP's own all-reduce
(``none``). An NCCL job's CPU-side spans are when work was enqueued, not when the GPU did it, so
there the GPU's own events are read instead (profiled with the CUDA activity): a step starts when
the GPU began its forward, a bucket is ready when the GPU finished the last kernel launched before
DDP issued its all-reduce (the collective's stream waits for that point of the compute stream) or
NCCL's kernel was launched, whichever was later, and it is done when NCCL's kernel ended. One
compute stream on one GPU only: with work on others, what a bucket waited for is not known. Why here and
not the run recorder: the job runs without gctestbed, on the machine that has the model, and only
the file travels.
"""

from __future__ import annotations

import bisect
import math
import os
from typing import Any

from .spec import UserError
from .tracefile import FORMAT, VERSION, read_json

# how the profiler names a tensor's element type (its "Input type"), as torch names the dtype
DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
          "long int": "int64", "int": "int32", "short int": "int16", "bool": "bool", "unsigned char": "uint8", "signed char": "int8"}
# how the profiler names an NCCL kernel's element type (its ``dtype`` argument)
NCCL_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
               "Int": "int32", "Long": "int64", "Char": "int8", "Byte": "uint8"}
# the GPU's own events: kernels, copies and fills, each with the correlation id of its launch
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load_profile(path: str) -> dict[str, Any]:
    """A Chrome trace written by torch.profiler (``.json`` or ``.json.gz``); one UserError otherwise."""
    data = read_json(path, "profile")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UserError(f"{path} is not a Chrome trace of torch.profiler (no traceEvents).")
    return data


def convert(profiles: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One gctestbed trace from the profiles of one job's ranks (``(path, profile)`` each, any
    subset of the ranks: a replay's rank r replays the r mod p-th given). One UserError, naming
    the file, where a profile lacks what a replay needs."""
    ranks = sorted((_rank(path, prof) for path, prof in profiles), key=lambda r: r["rank"])
    if len({r["rank"] for r in ranks}) != len(ranks):
        raise UserError("two profiles are of the same rank: give one profile per rank.")
    structure = ranks[0]["structure"]
    for r in ranks[1:]:
        if r["structure"] != structure:
            raise UserError(f"{r['path']} exchanged other buckets than {ranks[0]['path']} ({_sizes(r['structure'])} against "
                            f"{_sizes(structure)} elements): the profiles are not of one job.")
    names = [f"module.bucket{i}" for i in range(len(structure))]      # bucket i: the i-th backward released
    params = [[name, [numel]] for name, (numel, _) in reversed(list(zip(names, structure)))]   # the model's order
    if {dtype for _, dtype in structure} != {"float32"}:
        raise UserError(f"{ranks[0]['path']}: its buckets are {', '.join(sorted({d for _, d in structure}))}; "
                        "a replay's parameters are float32.")
    # each parameter closes a bucket of its own: DDP closes one once it holds the cap (given a cap, torch
    # 2.13 holds its first rebuilt bucket to the same cap, not to its default first-bucket 1 MiB)
    smallest = 4 * min(numel for numel, _ in structure)
    layouts = {"0": [list(p) for p in params], **{str(i + 1): [[name, [numel]]]
                                                  for i, (name, (numel, _)) in enumerate(zip(names, structure))}}
    total = sum(numel for numel, _ in structure)
    out_ranks = []
    for r in ranks:
        steps = []
        for k, step in enumerate(r["steps"]):
            # a replay's DDP sends its first step as one bucket of the whole model, as the profiled job's did if
            # its first step was profiled; where it was not (profiled from later, or a job that finds unused
            # parameters), that bucket is ready when the profiled step's last one was
            whole = k == 0
            buckets = []
            for i, b in enumerate(step["buckets"][-1:] if whole else step["buckets"]):
                numel = total if whole else structure[i][0]
                buckets.append({"seq": i, "bucket": i, "layout": 0 if whole else i + 1, "numel": numel, "sent": None,
                                "rounds": 1, "reduce_calls": 1, "gather_calls": 0, "reduce_bytes": numel * 4,
                                "gather_bytes": 0, "ready_s": b["ready_s"], "encode_s": 0.0, "decode_s": 0.0,
                                "start_s": b["ready_s"], "done_s": b["done_s"],
                                "payloads": [{"reduce": [["float32", numel]], "gather": []}]})
            steps.append({"step": k, **{key: step[key] for key in ("step_s", "compute_s", "forward_s", "optim_s")},
                          "encode_s": 0.0, "decode_s": 0.0, "comm_s": None, "sync_s": None, "buckets": buckets})
        out_ranks.append({"rank": r["rank"], "steps": steps})
    first = ranks[0]
    return {
        "format": FORMAT, "version": VERSION,
        "recorded": {"run_id": None, "source": "torch.profiler", "files": [os.path.basename(r["path"]) for r in ranks],
                     "created_at": first["created_at"], "host": first["host"], "cpu": None, "cpus": None, "torch": None,
                     "gctestbed": None, "launcher": None, "device": "cuda" if first["backend"] == "nccl" else "cpu",
                     "backend": first["backend"]},
        "job": {"compressor": "none", "compressor_options": {}, "workload": "profile", "workload_options": {},
                "nodes": first["world_size"], "batch_size": None, "bucket_cap_mb": smallest / 2 ** 20, "mode": "overlap",
                "comm": "allreduce", "comm_options": {}, "optimizer": first["optimizer"], "bw_bps": None,
                "latency_s": None, "steps": min(len(r["steps"]) for r in ranks), "dilate": 1},
        "parameters": params,
        "buffers": first["buffers"],
        "broadcast_buffers": bool(first["buffers"]),
        "layouts": {str(i): layouts for i in range(len(ranks))},
        "ranks": [{**r, "rank": i} for i, r in enumerate(out_ranks)],
    }


def _sizes(structure: list[tuple[int, str]]) -> str:
    return ", ".join(str(n) for n, _ in structure)


def _rank(path: str, prof: dict[str, Any]) -> dict[str, Any]:
    """One rank's steps, buckets and buffers, read from its profile's events."""
    # (the GPU's copies of the CPU's annotations, on the GPU's timeline, are left out: the spans read here are the CPU's)
    events = sorted((e for e in prof["traceEvents"] if e.get("ph") == "X" and "dur" in e
                     and e.get("cat") != "gpu_user_annotation"), key=lambda e: e["ts"])
    forwards = [e for e in events if e["name"] == "DistributedDataParallel.forward"]
    if len(forwards) < 2:
        raise UserError(f"{path} holds {len(forwards)} DDP forward passes: profile two steps or more of a "
                        "DistributedDataParallel model.")
    info = prof.get("distributedInfo") or {}
    nccl = info.get("backend") == "nccl" or any(e["name"].startswith("nccl:") for e in events)
    issued = [e for e in events if e["name"] == "c10d::allreduce_"]
    broadcasts = _spans(e for e in events if e["name"] == "c10d::broadcast_")
    steps = (_gpu_steps(path, events, forwards, issued) if nccl
             else _cpu_steps(path, events, forwards, issued, broadcasts))
    later = [tuple((b["numel"], b["dtype"]) for b in s["buckets"]) for s in steps[1:]]
    if len(set(later)) > 1:
        raise UserError(f"{path}: its steps exchanged different buckets ({'; '.join(_sizes(list(s)) for s in sorted(set(later)))} "
                        "elements): a replay repeats one bucket layout.")
    structure = list(later[0])
    total = sum(n for n, _ in structure)
    first = sum(b["numel"] for b in steps[0]["buckets"])
    if first != total:
        raise UserError(f"{path}: its first step exchanged {first} elements, its later steps {total}: a replay repeats "
                        "one model.")
    def casts_in(fwd):
        """The broadcasts DDP issued within the forward ``fwd``."""
        return broadcasts.between(fwd["ts"], fwd["ts"] + fwd["dur"], closed=True)

    # the buffers: what DDP broadcast in a forward, not in its second step's, which also sends the order of the
    # buckets it rebuilt: the forward with the fewest broadcasts (the latest of those)
    k = min(reversed(range(len(forwards))), key=lambda i: len(casts_in(forwards[i])))
    fwd, upto = forwards[k], forwards[k + 1]["ts"] if k + 1 < len(forwards) else math.inf
    casts = casts_in(fwd)
    if nccl and casts:
        raise UserError(f"{path}: DDP broadcast the model's buffers over NCCL; an NCCL job with buffers is not imported "
                        "yet (no profile of one has been read on a GPU): profile it with Gloo, or keep its buffers local "
                        "(broadcast_buffers=False).")
    sent = _pair(casts, [e for e in events if e["name"] == "gloo:broadcast" and fwd["ts"] <= e["ts"] < upto], every=False)
    if sent is None:
        raise UserError(f"{path}: the buffers DDP broadcast in its forward do not match the broadcasts Gloo ran, so their "
                        "dtypes are unknown.")
    buffers = [[f"buffer{i}", [_numel(e)], _dtype(g, path)] for i, (e, g) in enumerate(zip(casts, sent))]
    optim_names = {e["name"].split("#", 1)[1].split(".")[0].lower() for e in events if e["name"].startswith("Optimizer.step#")}
    return {"path": path, "rank": int(info.get("rank", 0)), "world_size": int(info.get("world_size", 1)),
            "backend": "nccl" if nccl else info.get("backend"), "host": prof.get("host_name"),
            "created_at": (prof["baseTimeNanoseconds"] / 1e9) if prof.get("baseTimeNanoseconds") else None,
            "optimizer": optim_names.pop() if len(optim_names) == 1 else None,
            "steps": steps, "structure": structure, "buffers": buffers}


def _cpu_steps(path: str, events: list[dict[str, Any]], forwards: list[dict[str, Any]],
               issued: list[dict[str, Any]], broadcasts: "_Launched") -> list[dict[str, Any]]:
    """A Gloo job's steps, from its CPU-side spans: each all-reduce DDP issued, and its run on one of
    the process group's threads (its dtype, and when it finished)."""
    ran = [e for e in events if e["name"] == "gloo:all_reduce"]
    if issued and not _dims(issued[0]):
        raise UserError(f"{path} was profiled without the tensors' shapes: profile with record_shapes=True.")
    # each issued all-reduce's own run on one of the process group's threads: its dtype and its end
    paired = _pair(issued, ran)
    if paired is None:
        raise UserError(f"{path}: its {len(issued)} all-reduces issued do not match the {len(ran)} Gloo ran, so their "
                        "dtypes are unknown (a profile cut inside a step?).")
    done = {id(a): b for a, b in zip(issued, paired)}
    optimizers = _spans(e for e in events if e["name"].startswith("Optimizer.step#"))
    by_issue = _spans(issued)
    steps = []
    for k, fwd in enumerate(forwards):
        start, end = fwd["ts"], forwards[k + 1]["ts"] if k + 1 < len(forwards) else math.inf
        # a bucket's ready time counts from the model's own forward, after DDP's broadcasts (as the
        # replay's model counts it, and gctestbed's hook records it)
        origin = max([start] + [e["ts"] + e["dur"] for e in broadcasts.between(start, start + fwd["dur"], closed=True)])
        mine = by_issue.between(start, end)
        if not mine:
            raise UserError(f"{path}: step {k} issued no all-reduce through DDP (a comm hook that exchanged otherwise, "
                            "or no_sync): nothing to replay.")
        optim = optimizers.between(start, end)
        last = max([e["ts"] + e["dur"] for e in optim] + [done[id(e)]["ts"] + done[id(e)]["dur"] for e in mine])
        steps.append({
            "step_s": ((end if end != math.inf else last) - start) / 1e6,
            "compute_s": ((optim[0]["ts"] if optim else last) - start) / 1e6,
            "forward_s": (start + fwd["dur"] - origin) / 1e6,
            "optim_s": sum(e["dur"] for e in optim) / 1e6 if optim else None,
            "buckets": [{"numel": _numel(e), "dtype": _dtype(done[id(e)], path),
                         "ready_s": (e["ts"] - origin) / 1e6,
                         "done_s": (done[id(e)]["ts"] + done[id(e)]["dur"] - origin) / 1e6}
                        for e in mine]})
    return steps


def _gpu_steps(path: str, events: list[dict[str, Any]], forwards: list[dict[str, Any]],
               issued: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An NCCL job's steps, on the GPU's clock: each GPU event is tied to the CPU call that launched
    it (the profiler's correlation id), so the CPU's spans say which step, forward, bucket or
    optimizer a kernel belongs to, and the kernel's own start and end say when the GPU did it."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    every = [e for e in events if e.get("cat") in GPU_CATS]
    if not every:
        raise UserError(f"{path} is of an NCCL job profiled without its GPU's events: profile it with "
                        "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA].")
    unlaunched = [e for e in every if (e.get("args") or {}).get("correlation") not in launches]
    if unlaunched:
        raise UserError(f"{path}: {len(unlaunched)} of its GPU events have no CPU call that launched them (no "
                        "correlation id), so their step cannot be told: a profile cut, or work launched outside it?")
    gpu = [(e, launches[e["args"]["correlation"]]) for e in every]
    kernels = [(e, at) for e, at in gpu if e["name"].startswith("nccl")]
    compute = [(e, at) for e, at in gpu if not e["name"].startswith("nccl")]
    # ready is read off one stream: the one ProcessGroupNCCL's stream waits on when a bucket is issued
    streams = {((e.get("args") or {}).get("device"), (e.get("args") or {}).get("stream")) for e, _ in compute}
    if len(streams) > 1:
        raise UserError(f"{path}: its GPU work ran on {len(streams)} streams or GPUs besides NCCL's; a job with work "
                        "beside its compute stream (side streams, several GPUs) is not read yet, because what a bucket "
                        "waited for on the GPU cannot be told from the CPU's order alone.")

    by_launch = _Launched(compute)
    nccl_by_launch = _Launched(kernels)
    optimizers, by_issue = _spans(e for e in events if e["name"].startswith("Optimizer.step#")), _spans(issued)
    steps = []
    ran_forward = [by_launch.between(fwd["ts"], fwd["ts"] + fwd["dur"]) for fwd in forwards]
    if not all(ran_forward):
        raise UserError(f"{path}: a DDP forward launched nothing on the GPU (a profile cut inside a step, or a model "
                        "on the CPU under NCCL?).")
    origins = [min(e["ts"] for e in ran) for ran in ran_forward]
    for k, fwd in enumerate(forwards):
        start, end, origin = fwd["ts"], forwards[k + 1]["ts"] if k + 1 < len(forwards) else math.inf, origins[k]
        mine = by_issue.between(start, end)
        if not mine:
            raise UserError(f"{path}: step {k} issued no all-reduce through DDP (a comm hook that exchanged otherwise, "
                            "or no_sync): nothing to replay.")
        buckets = []
        for e in mine:
            ran = nccl_by_launch.between(e["ts"], e["ts"] + e["dur"], pairs=True)
            if len(ran) != 1:
                raise UserError(f"{path}: an all-reduce DDP issued launched {len(ran)} NCCL kernels, not one: a profile "
                                "without the GPU's events for it, or cut inside a step?")
            (kernel, call), = ran
            before = by_launch.between(start, e["ts"])
            if not before:
                raise UserError(f"{path}: step {k} issued an all-reduce before its forward launched anything on the GPU.")
            # ready: the GPU done with what came before the issue, and the kernel launched (a CPU behind its GPU)
            buckets.append({"numel": _kernel_numel(kernel, e, path), "dtype": _nccl_dtype(kernel, path),
                            "ready_s": (max(max(g["ts"] + g["dur"] for g in before), call["ts"] + call["dur"]) - origin) / 1e6,
                            "done_s": (kernel["ts"] + kernel["dur"] - origin) / 1e6})
        forward = ran_forward[k]
        stepped = optimizers.between(start, end)
        optim = [g for o in stepped for g in by_launch.between(o["ts"], o["ts"] + o["dur"])]
        if stepped and not optim:
            raise UserError(f"{path}: step {k}'s optimizer launched nothing on the GPU (a profile cut inside a step?).")
        last = max([g["ts"] + g["dur"] for g in optim] + [origin + 1e6 * b["done_s"] for b in buckets])
        steps.append({
            "step_s": ((origins[k + 1] if k + 1 < len(forwards) else last) - origin) / 1e6,
            "compute_s": ((min(g["ts"] for g in optim) if optim else last) - origin) / 1e6,
            "forward_s": (max(g["ts"] + g["dur"] for g in forward) - origin) / 1e6,
            "optim_s": (max(g["ts"] + g["dur"] for g in optim) - min(g["ts"] for g in optim)) / 1e6 if optim else None,
            "buckets": buckets})
    return steps


class _Launched:
    """Events, each with the CPU span that placed it (a GPU event with its launch; a CPU span with
    itself), in the order of that span's start, so that what a span of the CPU's timeline placed is
    found by bisection, not by a scan of every event per step and bucket."""

    def __init__(self, pairs: list[tuple[dict[str, Any], dict[str, Any]]]):
        self.pairs = sorted(pairs, key=lambda p: p[1]["ts"])
        self.at = [at["ts"] for _, at in self.pairs]

    def between(self, lo: float, hi: float, pairs: bool = False, closed: bool = False) -> list:
        """The events launched in [lo, hi) ([lo, hi] if ``closed``), in launch order (with their
        launches, with ``pairs``)."""
        cut = bisect.bisect_right if closed else bisect.bisect_left
        chosen = self.pairs[bisect.bisect_left(self.at, lo):cut(self.at, hi)]
        return chosen if pairs else [e for e, _ in chosen]


def _spans(events) -> _Launched:
    """CPU spans, each placed by itself: found by their start."""
    return _Launched([(e, e) for e in events])


def _kernel_numel(kernel: dict[str, Any], issued: dict[str, Any], path: str) -> int:
    """The elements NCCL's kernel reduced (the profiler's ``In msg nelems``), or the issued tensor's."""
    numel = (kernel.get("args") or {}).get("In msg nelems")
    if numel is None:
        if not _dims(issued):
            raise UserError(f"{path}: its NCCL kernels do not say their sizes: profile with record_shapes=True.")
        return _numel(issued)
    return int(numel)


def _nccl_dtype(kernel: dict[str, Any], path: str) -> str:
    """The dtype of NCCL's kernel, as torch names it; one UserError where the profile names one not known here."""
    name = (kernel.get("args") or {}).get("dtype")
    if name not in NCCL_DTYPES:
        raise UserError(f"{path}: an NCCL kernel's dtype is {name!r}, not one of {', '.join(NCCL_DTYPES)}.")
    return NCCL_DTYPES[name]


def _pair(issued: list[dict[str, Any]], ran: list[dict[str, Any]], every: bool = True) -> list[dict[str, Any]] | None:
    """Each collective issued (``issued`` sorted by start, as a profile's events are read), with
    its run on the process group's threads: the earliest run not yet taken that began after it and
    has its size. Gloo runs its queue on two threads, so two collectives issued close together can
    start in either order. None where one has no run, or (``every``) where a run was never issued.
    Two of one size issued back to back may still be swapped (a profile gives no sequence number):
    their dtypes then match, only their ends may not. A run passed over (it began before the
    collective looking for its size) is never taken later, since later collectives begin later."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(ran, key=lambda r: r["ts"]):
        runs.setdefault(_numel(r), []).append(r)
    starts = {n: [r["ts"] for r in rs] for n, rs in runs.items()}
    first_left = dict.fromkeys(runs, 0)
    out = []
    for e in issued:
        n = _numel(e)
        i = bisect.bisect_left(starts.get(n, []), e["ts"], lo=first_left.get(n, 0))
        if i == len(starts.get(n, [])):
            return None
        out.append(runs[n][i])
        first_left[n] = i + 1
    return None if every and len(out) < len(ran) else out


def _dims(e: dict[str, Any]) -> list[int] | None:
    """The first tensor's shape of an event's inputs (a tensor list's first tensor)."""
    dims = (e.get("args") or {}).get("Input Dims") or []
    first = dims[0] if dims else None
    while isinstance(first, list) and first and isinstance(first[0], list):
        first = first[0]
    return first if isinstance(first, list) and first else None


def _numel(e: dict[str, Any]) -> int:
    return math.prod(_dims(e) or [0])


def _dtype(e: dict[str, Any], path: str) -> str:
    """The dtype of a process group's collective's tensor, as torch names it; one UserError where the
    profile does not say or names one not known here."""
    types = (e.get("args") or {}).get("Input type") or []
    if not types or types[0] not in DTYPES:
        raise UserError(f"{path}: a collective's tensor type is {types[0] if types else 'not recorded'!r}, "
                        f"not one of {', '.join(DTYPES)}.")
    return DTYPES[types[0]]


def replayable_here(trace: dict[str, Any]) -> str | None:
    """Why this host's torch cannot replay an imported ``trace``, or None. The trace holds one
    parameter per bucket and a cap of the smallest bucket; DDP closes its first rebuilt bucket at
    that cap where it was given one (torch 2.13's ``_BucketCapacityConfig``), but older DDPs hold
    it to 1 MiB and would join a first bucket under that to the next."""
    if (trace.get("recorded") or {}).get("source") != "torch.profiler":
        return None
    import torch.nn.parallel.distributed as ddp
    first = next((b["reduce_bytes"] for r in trace["ranks"] for s in r["steps"][1:2] for b in s["buckets"][:1]), None)
    if not hasattr(ddp, "_BucketCapacityConfig") and len(trace["parameters"]) > 1 and first is not None \
            and first < 1024 * 1024:
        return (f"this torch's DDP holds its first bucket to 1 MiB, and the imported trace's first bucket is {first} "
                "bytes: a replay here would join it to the next (torch 2.13 replays it).")
    return None

