"""A run's Chrome trace: valid for the viewers (the Trace Event Format's fields and units), and a
timeline held against sleeps of known length in a model's forward and backward, a method's encode
and decode and the optimizer, not against the code that produced it."""

from __future__ import annotations

import json
import time

import pytest
import torch

from gctestbed import chrometrace, results, trace
from gctestbed.compress.dense import FP16
from gctestbed.spec import LinkSpec, RunSpec
from helpers import BACKWARD_S, FORWARD_S, PausedChain, gctestbed

US = 1e6                  # the format's unit, microseconds, written out here on its own
ENCODE_S, DECODE_S, OPTIM_S = 0.08, 0.02, 0.04


def check_format(out: dict, ranks: int) -> list[dict]:
    """The Trace Event Format's JSON object: what Perfetto and chrome://tracing need of each event.
    Returns the events."""
    out = json.loads(json.dumps(out))                     # plain JSON all the way down
    assert out["displayTimeUnit"] in ("ms", "ns")
    events = out["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "i", "M"), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert isinstance(e["ts"], (int, float)) and e["s"] in ("g", "p", "t"), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(ranks)}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"} <= threads     # every track is named
    return events




class _SlowFP16(FP16):
    """fp16 whose encode takes ENCODE_S and decode DECODE_S longer: known lengths."""

    def encode(self, grad, bucket):
        time.sleep(ENCODE_S)
        return super().encode(grad, bucket)

    def decompress(self, payload, bucket, numel, out=None):
        time.sleep(DECODE_S)
        return super().decompress(payload, bucket, numel)


def _record(results_dir: str, steps: int = 2) -> dict:
    """A one-rank run of PausedChain with _SlowFP16, timed as the worker times it, stored, and traced."""
    from torch.nn.parallel import DistributedDataParallel
    from gctestbed.compress import hook
    from gctestbed.timing import Laps

    first, second = torch.nn.Linear(64, 256), torch.nn.Linear(256, 256)   # 64 KB and 256 KB of gradient
    model = DistributedDataParallel(PausedChain(first, second), bucket_cap_mb=0.1)
    state = hook.install(model, _SlowFP16())
    rec = results.Recorder(results_dir, "chrome1")
    rec.start_run(RunSpec(nodes=1, link=LinkSpec(bw_bps=10**9), steps=steps, compressor="fp16", run_id="chrome1"), {})
    for step in range(steps):
        laps = Laps()
        model(torch.rand(8, 64)).sum().backward()
        compute_s = laps.lap()
        time.sleep(OPTIM_S)                      # the optimizer, of known length
        optim_s = laps.lap()
        stats = state.take_step_stats()
        rec.step(0, step, step_s=compute_s + optim_s, compute_s=compute_s, optim_s=optim_s, **stats)
    rec.finish_run("ok")
    try:
        return trace.extract(rec.conn, "chrome1")
    finally:
        rec.close()


def test_the_timeline_matches_sleeps_of_known_length(single_rank_group, tmp_path):
    """In microseconds, against the sleeps: a bucket is ready after the forward's pause, the first
    layer's a backward pause after the second's; each encode and decode lasts its sleep; the one
    driver thread encodes the first layer's bucket only after the second's (its encode is longer
    than the backward pause between them, so it starts later than it was ready); every bucket is
    back before backward returned; the optimizer lasts its sleep after it."""
    events = check_format(chrometrace.events(_record(str(tmp_path / "results"))), ranks=1)
    step = [e for e in events if e.get("args", {}).get("step") == 1]
    start = next(e for e in step if e["name"] == "step 1")["ts"]
    compute = next(e for e in step if e["name"] == "forward+backward")
    optimizer = next(e for e in step if e["name"] == "optimizer")

    def of(numel, name):
        return next(e for e in step if e["name"] == name and e["args"]["numel"] == numel)

    second, first = 256 * 256 + 256, 64 * 256 + 256
    assert of(second, "ready")["ts"] - start >= FORWARD_S * US
    assert of(first, "ready")["ts"] - of(second, "ready")["ts"] >= BACKWARD_S * US
    for numel in (first, second):
        assert ENCODE_S * US <= of(numel, "encode")["dur"] < 2 * ENCODE_S * US, of(numel, "encode")
        assert DECODE_S * US <= of(numel, "decode")["dur"] < ENCODE_S * US, of(numel, "decode")
        assert of(numel, "encode")["ts"] >= of(numel, "ready")["ts"]
        collective = of(numel, "collective")
        assert collective["ts"] == pytest.approx(of(numel, "encode")["ts"] + of(numel, "encode")["dur"], abs=0.01)
        assert collective["ts"] + collective["dur"] == pytest.approx(of(numel, "decode")["ts"], abs=0.01)
        assert of(numel, "decode")["ts"] + of(numel, "decode")["dur"] <= compute["ts"] + compute["dur"] + 0.01
        # what went on the wire: the layer's gradient in half precision, counted on the layer
        assert collective["args"]["payloads"] == [{"reduce": [["float16", numel]], "gather": []}]
    assert of(first, "encode")["ts"] >= of(second, "encode")["ts"] + ENCODE_S * US
    # it waited for the second's encode: by the encode's length less the backward pause as it ran (at least
    # BACKWARD_S; nominal BACKWARD_S here failed CI once, a pause 0.5 ms over its sleep on a busy host)
    gap = of(first, "ready")["ts"] - of(second, "ready")["ts"]
    assert of(first, "encode")["ts"] - of(first, "ready")["ts"] >= ENCODE_S * US - gap
    assert OPTIM_S * US <= optimizer["dur"] and optimizer["ts"] >= compute["ts"] + compute["dur"] - 0.01


def _synthetic(new_fields: bool, stored_at: bool) -> dict:
    """A two-rank trace of two steps; without ``new_fields`` its buckets are as a run stored before
    schema 14 left them (no start_s, done_s, payloads), without ``stored_at`` its steps have no t."""
    ranks = []
    for rank in range(2):
        steps = []
        for s in range(2):
            b = {"seq": 0, "bucket": 0, "layout": 0, "numel": 10, "sent": None, "rounds": 1, "reduce_calls": 1,
                 "gather_calls": 0, "reduce_bytes": 40, "gather_bytes": 0, "ready_s": 0.1, "encode_s": 0.01,
                 "decode_s": 0.02}
            if new_fields:
                b.update(start_s=0.15, done_s=0.3, payloads=[{"reduce": [["float32", 10]], "gather": []}])
            step = {"step": s, "step_s": 0.5, "compute_s": 0.35, "optim_s": 0.1, "encode_s": 0.01, "decode_s": 0.02,
                    "comm_s": 0.2, "sync_s": None, "buckets": [b]}
            if stored_at:
                step["t"] = 1000.0 + 0.5 * (s + 1) + 0.25 * rank
            steps.append(step)
        ranks.append({"rank": rank, "steps": steps})
    return {"job": {"compressor": "none", "comm": "allreduce", "mode": "overlap"}, "recorded": {"run_id": "x"},
            "ranks": ranks}


def test_events_a_run_did_not_record_are_left_out():
    """A run stored before schema 14 has ready times but no encode start or delivery: its buckets
    show when they were ready and nothing invented after."""
    events = check_format(chrometrace.events(_synthetic(new_fields=False, stored_at=True)), ranks=2)
    names = {e["name"] for e in events if e["ph"] != "M"}
    assert "ready" in names and not names & {"encode", "collective", "decode"}
    full = check_format(chrometrace.events(_synthetic(new_fields=True, stored_at=True)), ranks=2)
    assert {"encode", "collective", "decode"} <= {e["name"] for e in full}


def test_steps_lie_on_the_stored_clock_or_end_to_end():
    """With each step's stored wall time, ranks share one clock (rank 1 stored 0.25 s later, so
    its steps start 0.25 s later); without it, each rank's steps are laid end to end from 0."""
    def starts(trace_):
        out = chrometrace.events(trace_)
        return {(e["pid"], e["args"]["step"]): e["ts"] for e in out["traceEvents"] if e["name"].startswith("step ")}

    assert starts(_synthetic(True, stored_at=True)) == pytest.approx(
        {(0, 0): 0, (0, 1): 0.5 * US, (1, 0): 0.25 * US, (1, 1): 0.75 * US})
    assert starts(_synthetic(True, stored_at=False)) == pytest.approx(
        {(0, 0): 0, (0, 1): 0.5 * US, (1, 0): 0, (1, 1): 0.5 * US})


def test_chrome_refuses_what_it_cannot_read_in_one_sentence(tmp_path):
    for args, words in ((["missing.trace.json"], "there is no trace file"),
                        (["--results", str(tmp_path / "none")], "there is no results store")):
        proc = gctestbed("trace", "chrome", *args, "-o", str(tmp_path / "out.json"))
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()
