"""An NCCL job's torch.profiler traces, imported on the GPU's clock (gctestbed/profiler_import.py).

The profiles in gctestbed/traces/h200/profiles are of a plain DDP job (no gctestbed: scripts/gpu-check's
``profile`` step) on an NVIDIA H200, two ranks sharing the GPU over NCCL's socket transport, the
MLP of the GPU traces with DDP's bucket cap at 4 MB (three buckets) and 25 MB (one). The imported
trace is held against what does not come from the importer: the buckets against the layers'
sizes worked by hand, the steps against the job's own clock (``time.perf_counter`` around its
ten profiled steps, ``*-steps.json``), each step's start, forward, compute and optimizer against
the profiler's own GPU-side spans of the CPU's annotations (Kineto's, not the importer's), and the
ready times against the NCCL kernels taken in the order the GPU ran them (an all-reduce's kernel
starts as soon as the compute stream passes the point where DDP issued it and its launch returned).
Only the first bucket of a step is held to its kernel's start; a later one is held between its
predecessor's ready and done (in these profiles backward ended before the first exchange did)."""

from __future__ import annotations

import copy
import functools
import gzip
import json
from pathlib import Path

import pytest

from gctestbed import profiler_import
from gctestbed.spec import UserError

PROFILES = Path(__file__).resolve().parent.parent / "gctestbed" / "traces" / "h200" / "profiles"
HIDDEN = 1024 * 1024 + 1024                  # a 1024x1024 layer and its bias
HEAD = 10 * 1024 + 10                        # the 10-way head and its bias
WHOLE = 3 * HIDDEN + HEAD


def _paths(cap: int) -> list[str]:
    return [str(PROFILES / f"cap{cap}-rank{r}.json.gz") for r in (0, 1)]


def _convert(cap: int) -> dict:
    return profiler_import.convert([(p, profiler_import.load_profile(p)) for p in _paths(cap)])


@functools.lru_cache(maxsize=None)
def _events(path: str) -> list[dict]:
    """A profile's events, read once for every check below (read-only)."""
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def _annotations(path: str, name: str) -> list[dict]:
    """The GPU's side of a CPU annotation (``gpu_user_annotation``), in order: the profiler itself
    (Kineto) spans the GPU work the annotated CPU range launched, apart from the importer's code."""
    events = _events(path)
    return sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith(name)),
                  key=lambda e: e["ts"])


def _nccl_kernels(path: str) -> list[tuple[dict, float]]:
    """The all-reduce kernels of a profile, in the order the GPU ran them, each with when the CPU's call
    that launched it returned (the CUDA runtime's or driver's event of the same correlation id)."""
    events = _events(path)
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_AllReduce")),
                     key=lambda e: e["ts"])
    return [(k, calls[k["args"]["correlation"]]["ts"] + calls[k["args"]["correlation"]]["dur"]) for k in kernels]


@pytest.mark.parametrize("cap,later", [(4, [HEAD + HIDDEN, HIDDEN, HIDDEN]), (25, [WHOLE])])
def test_an_nccl_jobs_profile_imports_as_its_buckets_and_the_gpus_times(cap, later):
    data = _convert(cap)
    assert data["recorded"]["device"] == "cuda" and data["recorded"]["backend"] == "nccl"
    assert data["job"]["nodes"] == 2 and data["job"]["optimizer"] == "sgd"
    for rank, path in zip(data["ranks"], _paths(cap)):
        steps = rank["steps"]
        assert len(steps) == 10
        for s in steps[1:]:
            assert [b["numel"] for b in s["buckets"]] == later
        # the steps, against the job's own clock around its ten profiled steps: the GPU's span of them
        # fits inside it, short only by the host's lead on the first launch and the last synchronise's return
        # (measured: 1.6 to 3.0 % short)
        own = json.loads(Path(path.replace(".json.gz", "-steps.json")).read_text())["mean_step_s_profiled"]
        mean = sum(s["step_s"] for s in steps) / len(steps)
        assert 0.95 * own <= mean <= own
        kernels = _nccl_kernels(path)
        forwards, optims = _annotations(path, "DistributedDataParallel.forward"), _annotations(path, "Optimizer.step#")
        waits = []
        for s in steps[1:]:
            origin = None
            for i, b in enumerate(s["buckets"]):
                k, launched = kernels[len(later) * s["step"] + i]
                origin = k["ts"] + k["dur"] - b["done_s"] * 1e6          # done at the end of its kernel
                # a step counts from the GPU's forward, as the profiler spans it on the GPU
                assert origin == pytest.approx(forwards[s["step"]]["ts"], abs=0.01)
                began, launched = (k["ts"] - origin) / 1e6, (launched - origin) / 1e6
                assert b["ready_s"] <= began + 1e-6
                if i == 0:                       # nothing ahead of it on NCCL's stream: it began once ready and launched
                    waits.append(began - max(b["ready_s"], launched))
                else:                            # backward releases buckets in turn, all before the first's exchange ended
                    assert s["buckets"][i - 1]["ready_s"] < b["ready_s"] < s["buckets"][i - 1]["done_s"]
            # the forward, the optimizer, and the compute until it, as the profiler spans them on the GPU
            fwd, opt = forwards[s["step"]], optims[s["step"]]
            assert s["forward_s"] == pytest.approx(fwd["dur"] / 1e6, abs=1e-8)
            assert s["optim_s"] == pytest.approx(opt["dur"] / 1e6, abs=1e-8)
            assert s["compute_s"] == pytest.approx((opt["ts"] - origin) / 1e6, abs=1e-8)
        # ...within microseconds (1-5 µs), but once for 0.32 ms (1 of 36: a turn of the other process on the shared GPU?)
        assert sorted(waits)[len(waits) // 2] < 20e-6 and max(waits) < 1e-3


def test_what_an_nccl_profile_cannot_give_is_refused_in_one_sentence():
    path = _paths(4)[0]
    prof = profiler_import.load_profile(path)
    no_gpu = {**prof, "traceEvents": [e for e in prof["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]}
    with pytest.raises(UserError, match="without its GPU's events.*ProfilerActivity.CUDA"):
        profiler_import.convert([(path, no_gpu)])
    # DDP's buffers broadcast over NCCL: a broadcast inside a forward
    casts = copy.deepcopy(prof)
    fwd = next(e for e in casts["traceEvents"] if e["name"] == "DistributedDataParallel.forward" and e["cat"] != "gpu_user_annotation")
    casts["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "c10d::broadcast_", "ts": fwd["ts"] + 1, "dur": 1,
                                 "pid": fwd["pid"], "tid": fwd["tid"], "args": {}})
    for e in casts["traceEvents"]:
        if e["name"] == "DistributedDataParallel.forward" and e["cat"] != "gpu_user_annotation" and e is not fwd:
            casts["traceEvents"].append({**e, "name": "c10d::broadcast_", "ts": e["ts"] + 1, "dur": 1, "cat": "cpu_op", "args": {}})
    with pytest.raises(UserError, match="buffers over NCCL"):
        profiler_import.convert([(path, casts)])
    # GPU events no CPU call launched (no correlation id): their step cannot be told
    orphan = copy.deepcopy(prof)
    next(e for e in orphan["traceEvents"] if e.get("cat") == "gpu_memcpy")["args"].pop("correlation")
    with pytest.raises(UserError, match="no CPU call that launched them"):
        profiler_import.convert([(path, orphan)])
    # compute on a second stream: what a bucket waited for cannot be told from the CPU's order
    side = copy.deepcopy(prof)
    next(e for e in side["traceEvents"] if e.get("cat") == "gpu_memset")["args"]["stream"] = 99
    with pytest.raises(UserError, match="2 streams or GPUs"):
        profiler_import.convert([(path, side)])
    # a profile cut inside a step: the last optimizer's kernels missing
    cut = copy.deepcopy(prof)
    last = max((e for e in cut["traceEvents"] if e["name"].startswith("Optimizer.step#") and e.get("cat") == "user_annotation"),
               key=lambda e: e["ts"])
    calls = {e["args"]["correlation"] for e in cut["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and last["ts"] <= e["ts"] <= last["ts"] + last["dur"] and "correlation" in e.get("args", {})}
    cut["traceEvents"] = [e for e in cut["traceEvents"] if (e.get("args") or {}).get("correlation") not in calls]
    with pytest.raises(UserError, match="optimizer launched nothing on the GPU"):
        profiler_import.convert([(path, cut)])
    # a dtype the importer does not know
    odd = copy.deepcopy(prof)
    for e in odd["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            e["args"]["dtype"] = "Float8e4m3"
    with pytest.raises(UserError, match="dtype is 'Float8e4m3'"):
        profiler_import.convert([(path, odd)])
