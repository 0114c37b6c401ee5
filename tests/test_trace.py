"""A trace holds what a run did, checked against what does not come from the trace's code: the
model's parameters counted on the model itself, and twobit's payloads by MXNet's packing rule
(16 two-bit codes to 4 bytes, so a bucket of n elements is ceil(n / 16) * 4 bytes)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from gctestbed import tracefile, workloads
from gctestbed.spec import UserError
from helpers import BACKWARD_S, FORWARD_S, PausedChain, gctestbed, here, kept_runs
from test_chrometrace import check_format

WORKLOAD = "mlp:width=256,depth=2,input_dim=64"
NODES, STEPS = 2, 5


@pytest.mark.root
def test_a_trace_of_a_real_run_holds_its_model_ranks_steps_and_payloads(tmp_path, state_dir):
    run = gctestbed("run", "--nodes", str(NODES), "--bw", "1gbit", "--steps", str(STEPS), "--compressor", "twobit",
                    "--eval-every", "2", "--record-trace", str(tmp_path / "at-once.json"),
                    "--workload", WORKLOAD, "--no-calibrate", "--results", str(tmp_path / "results"))
    assert run.returncode == 0, run.stderr
    path = str(tmp_path / "run.trace.json.gz")
    rec = here("trace", "record", "--results", tmp_path / "results", "-o", path)
    assert rec.returncode == 0, rec.stderr
    data = tracefile.load(path)
    assert tracefile.load(str(tmp_path / "at-once.json")) == data        # run --record-trace: the same trace
    assert data["broadcast_buffers"] is True                             # DDP's default, as the run built it

    model = workloads.build("mlp", {"width": 256, "depth": 2, "input_dim": 64}, seed=0, rank=0, batch_size=8, world=1).model
    assert data["parameters"] == [["module." + n, list(p.shape)] for n, p in model.named_parameters()]
    assert [r["rank"] for r in data["ranks"]] == list(range(NODES))
    for r in data["ranks"]:
        assert [s["step"] for s in r["steps"]] == list(range(STEPS))
        for s in r["steps"]:
            assert s["buckets"] and all(s[k] is not None and s[k] > 0 for k in ("step_s", "compute_s", "encode_s", "forward_s"))
            # the forward ends before backward hands DDP any bucket
            assert s["forward_s"] <= min(b["ready_s"] for b in s["buckets"]), s
            assert sum(b["numel"] for b in s["buckets"]) == sum(p.numel() for p in model.parameters())
            for b in s["buckets"]:
                assert b["reduce_bytes"] == 0 and b["gather_bytes"] == math.ceil(b["numel"] / 16) * 4, b
                # the hook got the bucket within the step's compute (forward and backward), after it began,
                # the clock not moved by the held-out evaluations between steps (--eval-every)
                assert 0 < b["ready_s"] <= s["compute_s"], (s, b)
                assert b["encode_s"] > 0 and b["decode_s"] > 0, b
                # its encoding began once the hook had it, and its result came back after encoding and
                # decoding, before backward returned (DDP waits for every bucket)
                assert b["ready_s"] <= b["start_s"], b
                assert b["start_s"] + b["encode_s"] + b["decode_s"] <= b["done_s"] <= s["compute_s"], (s, b)
                # per round what went on the wire: the gathered bytes, counted from dtypes and lengths
                assert len(b["payloads"]) == b["rounds"] == 1 and b["payloads"][0]["reduce"] == [], b
                assert sum(n * torch.empty(0, dtype=getattr(torch, d)).element_size()
                           for d, n in b["payloads"][0]["gather"]) == b["gather_bytes"], b
            # each bucket's encoding is part of the step's (the step's counter sums the buckets')
            assert sum(b["encode_s"] for b in s["buckets"]) <= s["encode_s"] * 1.0001 + 1e-9, s
    # the Chrome trace, of the run in the store and of the file alike: one encode, collective and decode per bucket
    for source in (["--results", str(tmp_path / "results")], [path]):
        chrome = here("trace", "chrome", *source, "-o", tmp_path / "chrome.json")
        assert chrome.returncode == 0, chrome.stderr
        events = check_format(json.loads((tmp_path / "chrome.json").read_text()), ranks=NODES)
        for name in ("encode", "collective", "decode"):
            assert sum(e["name"] == name for e in events) == sum(len(s["buckets"]) for r in data["ranks"]
                                                                  for s in r["steps"]), name
        assert sum(e["name"] == "forward" for e in events) == NODES * STEPS
    shown = here("trace", "show", path, "--json")
    assert shown.returncode == 0, shown.stderr
    about = json.loads(shown.stdout)
    assert about["elements"] == sum(p.numel() for p in model.parameters())
    assert [r["bytes"] for r in about["ranks"]] == [math.ceil(about["elements"] / 16) * 4] * NODES
    # the job again (another seed): one trace of both runs, each time the median of the two (their mean). What
    # this checks is the matching of real runs' buckets and the command; the median itself is checked by hand
    # in test_a_trace_of_several_runs_takes_each_time_as_their_median
    # (run in this process on a kept network, as a sweep's cell: the lone run from the command line is the first)
    with kept_runs() as kept:
        second = kept(nodes=str(NODES), bw="1gbit", steps=str(STEPS), compressor="twobit", seed="1", workload=WORKLOAD,
                      results_dir=str(tmp_path / "results"))
    assert here("trace", "record", second, "--results", tmp_path / "results", "-o", tmp_path / "second.json").returncode == 0
    both = here("trace", "record", data["recorded"]["run_id"], second, "--results", tmp_path / "results",
                "-o", tmp_path / "both.json")
    assert both.returncode == 0, both.stderr
    other, merged = tracefile.load(str(tmp_path / "second.json")), tracefile.load(str(tmp_path / "both.json"))
    assert merged["recorded"]["merged_from"] == [data["recorded"]["run_id"], second]
    for r, rank in enumerate(merged["ranks"]):
        for k, s in enumerate(rank["steps"]):
            a, b = data["ranks"][r]["steps"][k], other["ranks"][r]["steps"][k]
            assert s["compute_s"] == pytest.approx((a["compute_s"] + b["compute_s"]) / 2)
            for m in s["buckets"]:
                x = next(y for y in a["buckets"] if y["bucket"] == m["bucket"])
                z = next(y for y in b["buckets"] if y["bucket"] == m["bucket"])
                assert m["ready_s"] == pytest.approx((x["ready_s"] + z["ready_s"]) / 2), (m, x, z)


@pytest.mark.root
def test_a_sweep_records_one_trace_per_method_on_the_same_model(tmp_path, state_dir):
    out = tmp_path / "traces"
    sweep = gctestbed("sweep", "--compressor", "none;twobit", "--bw", "1gbit", "--nodes", str(NODES), "--steps", "3",
                      "--workload", WORKLOAD, "--calibrate", "none", "--record-traces", str(out),
                      "--results", str(tmp_path / "results"))
    assert sweep.returncode == 0, sweep.stderr
    files = sorted(out.iterdir())
    assert [f.name.split("-")[0] for f in files] == ["none", "twobit"], files
    model = workloads.build("mlp", {"width": 256, "depth": 2, "input_dim": 64}, seed=0, rank=0, batch_size=8, world=1).model
    numel = sum(p.numel() for p in model.parameters())
    for f in files:
        data = tracefile.load(str(f))
        method = f.name.split("-")[0]
        assert data["job"]["compressor"] == method and data["recorded"]["run_id"] in f.name
        assert data["parameters"] == [["module." + n, list(p.shape)] for n, p in model.named_parameters()]
        for r in data["ranks"]:
            for st in r["steps"]:
                # what each method put on the wire, by its own rule: fp32 all-reduced, or 16 two-bit codes in 4 bytes
                sent = [(b["reduce_bytes"], b["gather_bytes"]) for b in st["buckets"]]
                want = [(4 * b["numel"], 0) if method == "none" else (0, math.ceil(b["numel"] / 16) * 4) for b in st["buckets"]]
                assert sent == want and sum(b["numel"] for b in st["buckets"]) == numel
    refused = here("sweep", "--compressor", "none", "--comm", "localsgd", "--record-traces", tmp_path / "x",
                   "--dry-run", "--results", tmp_path / "results")
    assert refused.returncode != 0 and "because it exchanges with --comm localsgd" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_file_that_is_not_a_trace_of_this_version_is_refused_in_one_sentence(tmp_path):
    for text, words in (("not json", "cannot read trace"), ('{"a": 1}', "is not a gctestbed trace"),
                        (json.dumps({"format": tracefile.FORMAT, "version": 99}), "version 99 trace")):
        path = tmp_path / "t.json"
        path.write_text(text)
        with pytest.raises(UserError, match=words):
            tracefile.load(str(path))




def test_a_buckets_ready_time_is_when_backward_released_it(single_rank_group):
    """Held against sleeps of known length, not against the code: a layer's gradients cannot reach
    the hook before the forward's pause, and the first layer's come a backward pause after the
    second's (each layer its own bucket after DDP's first step)."""
    from torch.nn.parallel import DistributedDataParallel
    from gctestbed.compress import create, hook

    first, second = torch.nn.Linear(64, 256), torch.nn.Linear(256, 256)   # 64 KB and 256 KB of gradient
    model = DistributedDataParallel(PausedChain(first, second), bucket_cap_mb=0.1)
    state = hook.install(model, create("none", {}))
    for _ in range(2):
        model(torch.rand(8, 64)).sum().backward()
        exchanges = state.take_step_stats()["exchanges"]
    ready = {ex["numel"]: ex["ready_s"] for ex in exchanges}
    second_at, first_at = ready[256 * 256 + 256], ready[64 * 256 + 256]
    assert FORWARD_S <= second_at < FORWARD_S + BACKWARD_S, ready
    assert first_at - second_at >= BACKWARD_S, ready


@pytest.mark.parametrize("parts", [1, 2])
def test_the_forward_time_is_the_forward_passes_alone(single_rank_group, parts):
    """The worker's forward time, held against PausedChain's known pauses: one FORWARD_S per
    forward pass (a method's micro-batches each run one), none of backward's BACKWARD_S."""
    from torch.nn.parallel import DistributedDataParallel
    from gctestbed.worker import forward_backward

    model = DistributedDataParallel(PausedChain(torch.nn.Linear(64, 256), torch.nn.Linear(256, 256)))
    x, y = torch.rand(8, 64), torch.rand(8, 256)
    start = time.perf_counter()
    _, forward_time = forward_backward(model, lambda out, t: (out - t).square().mean(), x, y, parts)
    forward_s = forward_time()
    took = time.perf_counter() - start
    assert parts * FORWARD_S <= forward_s < parts * FORWARD_S + BACKWARD_S / 2, forward_s
    assert took >= parts * (FORWARD_S + BACKWARD_S)      # the backward pauses did run, outside the forward time



def _tiny_trace(path) -> str:
    """A hand-made trace of a twobit run: one rank, two steps, one bucket, buckets of 4 MB."""
    bucket = {"seq": 0, "bucket": 0, "layout": 0, "numel": 10, "sent": None, "rounds": 1, "reduce_calls": 0,
              "gather_calls": 2, "reduce_bytes": 0, "gather_bytes": 4, "ready_s": 0.01, "encode_s": 0.001, "decode_s": 0.001}
    trace = {"format": tracefile.FORMAT, "version": tracefile.VERSION, "recorded": {},
             "job": {"compressor": "twobit", "compressor_options": {"threshold": 0.5}, "bucket_cap_mb": 4.0,
                     "workload": "mlp", "workload_options": {}, "batch_size": 16},
             "parameters": [["module.w", [10]]], "layouts": {"0": {"0": [["module.w", [10]]]}},
             "ranks": [{"rank": 0, "steps": [{"step": s, "buckets": [bucket]} for s in range(2)]}]}
    tracefile.save(trace, str(path))
    return str(path)


def test_a_replay_is_checked_against_its_trace_in_one_sentence(tmp_path):
    from gctestbed import flags
    from gctestbed.spec import SpecError
    path = _tiny_trace(tmp_path / "t.json")
    # --replay is the workload replay:trace=...; the bucket cap is the trace's; codec=recorded takes its method
    spec = flags.build_spec(replay=f"{path},codec=recorded", steps="2")
    assert (spec.workload, spec.workload_options["trace"], spec.workload_options["codec"]) == ("replay", path, "recorded")
    assert (spec.compressor, spec.compressor_options, spec.bucket_cap_mb) == ("twobit", {"threshold": 0.5}, 4.0)
    assert spec.batch_size == 16                        # the batch whose compute the trace holds
    # with the method running for real, the run's own method is kept
    assert flags.build_spec(replay=path, steps="2", compressor="fp16").compressor == "fp16"
    for kwargs, words in (({"replay": path, "workload": "cnn"}, "leave out --workload"),
                          ({"replay": f"{path},codec=recorded", "compressor": "dgc"}, "replays the trace's twobit"),
                          ({"replay": f"{path},codec=recorded", "compressor": "twobit:threshold=1"}, "replays the trace's twobit"),
                          ({"replay": f"{path},codec=maybe"}, "codec must be real or recorded"),
                          ({"replay": path, "steps": "3"}, "holds 2 steps"),
                          ({"replay": path, "steps": "2", "bucket_cap_mb": "1"}, "used --bucket-cap-mb 4"),
                          ({"replay": f"{path},real=3"}, "more real ranks than --nodes 2"),
                          ({"replay": f"{path},real=1", "batch_size": "8"}, "use its --batch-size 16"),
                          ({"replay": f"{path},real=1,codec=recorded"}, "leave out codec=recorded when real=N"),
                          ({"replay": f"{path},optim=maybe"}, "optim must be real or recorded"),
                          ({"replay": f"{path},optim=recorded"}, "lacks some"),        # the tiny trace has no optim_s
                          ({"replay": path, "compressor": "twobit", "dilate": "4"}, "replay twobit with codec=recorded"),
                          ({"replay": f"{path},real=1", "dilate": "4"}, "cannot stretch a mixed run")):
        with pytest.raises(SpecError, match=words):
            flags.build_spec(**{"steps": "2", **kwargs})


def test_a_recorded_optimizer_waits_the_recorded_times_scaled_and_updates_nothing(tmp_path):
    """optim=recorded, held against the clock: each step takes the recorded rank's optimizer time
    that step x scale (hand-written: 40 and 80 ms, x 2), and the parameters stay as they were."""
    from gctestbed import flags, workloads
    from gctestbed.spec import SpecError
    path = tmp_path / "t.json"
    trace = tracefile.load(_tiny_trace(path))
    for s, optim_s in zip(trace["ranks"][0]["steps"], (0.04, 0.08)):
        s["optim_s"] = optim_s
    tracefile.save(trace, str(path))
    spec = flags.build_spec(replay=f"{path},optim=recorded,scale=2", steps="2")
    work = workloads.build("replay", spec.workload_options, seed=0, rank=1, batch_size=16)   # rank 1: recorded rank 1 mod 1
    model = work.model
    real = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer = work.optimizer(real)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in model.parameters()]
    for want in (0.08, 0.16):
        start = time.perf_counter()
        optimizer.step()
        took = time.perf_counter() - start
        assert want <= took < want + 0.03, (want, took)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert workloads.build("replay", flags.build_spec(replay=str(path), steps="2").workload_options, seed=0, rank=0,
                           batch_size=16).optimizer is None                 # the default: the real optimizer
    with pytest.raises(SpecError, match="leave out optim=recorded when real=N"):
        flags.build_spec(replay=f"{path},optim=recorded,real=1", steps="2")


def test_a_sweep_of_a_recorded_codec_labels_its_cells_with_the_traces_method(tmp_path):
    """codec=recorded sends the trace's payloads whatever the compressor axis says, so the report
    labels such a cell with the trace's method and its options (two traces of one method apart),
    not the axis's default none; the cell's key, which a resumed sweep matches, is left as planned."""
    from gctestbed import sweep
    from gctestbed.analysis import cells
    path = _tiny_trace(tmp_path / "t.json")
    grid = sweep.Grid(axes={**{a: [v] for a, v in ((a, sweep.flags.DEFAULTS[a]) for a in sweep.AXES)},
                            "workload": [f"replay:trace={path},codec=recorded"]}, steps=2, results_dir=str(tmp_path))
    (cell,) = sweep.plan(grid)
    assert cell.spec.compressor == "twobit" and cell.params["compressor"] == "none"
    assert cells.method_label(cell.spec, cell.params) == "twobit:threshold=0.5"
    real = sweep.plan(sweep.Grid(axes={**grid.axes, "workload": ["mlp"], "compressor": ["fp16"]}, steps=2,
                                 results_dir=str(tmp_path)))[0]
    assert cells.method_label(real.spec, real.params) == "fp16"     # a real cell: as the sweep typed it
    assert flags_default_dilate_names_alike(grid)


def flags_default_dilate_names_alike(grid) -> bool:
    """A sweep typed with --dilate 1.0 is the one typed without it (its name resumes it)."""
    import dataclasses
    return (grid.default_name() == dataclasses.replace(grid, dilate="1.0").default_name()
            and dataclasses.replace(grid, dilate="4").default_name() == dataclasses.replace(grid, dilate="4.0").default_name())


def test_a_trace_that_cannot_be_written_is_refused_in_one_sentence_and_leaves_nothing(tmp_path):
    path = _tiny_trace(tmp_path / "t.json")
    with pytest.raises(UserError, match="cannot write trace"):
        tracefile.save(tracefile.load(path), str(tmp_path / "missing" / "t.json.gz"))
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "t.json").mkdir()           # a directory where the file should go: the rename fails
    with pytest.raises(UserError, match="cannot write trace"):
        tracefile.save(tracefile.load(path), str(tmp_path / "ro" / "t.json"))
    assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == ["t.json"]   # no partial file left behind


def test_a_replay_sends_buffers_as_its_recorded_run_did(tmp_path):
    """buffers=local (DDP's forward_sync_buffers=False) in the recorded job's workload options: the
    replay's DDP must not broadcast either, or a replay of such a job sends bytes the job did not
    (ResNet-50: 212 kB a step). The real run's side is held to its wire in
    tests/test_claims.py's end-to-end g run."""
    from gctestbed import flags, workloads
    path = tmp_path / "t.json"
    trace = tracefile.load(_tiny_trace(path))
    for options, sends in (({}, True), ({"buffers": "broadcast"}, True), ({"buffers": "local"}, False)):
        trace["job"]["workload_options"] = options
        tracefile.save(trace, str(path))
        replay = flags.build_spec(replay=str(path), steps="2").workload_options
        assert workloads.build("replay", replay, seed=0, rank=0, batch_size=16).broadcast_buffers is sends, options
    # a trace of that replay: its job is the replay (no buffers option); the trace itself says so, and
    # its own replay does not broadcast either (planted: read from the job's options -> it does)
    from gctestbed import trace as tracing
    spec = flags.build_spec(replay=str(path), steps="2")
    assert tracing._sends_buffers(spec) is False
    assert tracing._sends_buffers(flags.build_spec(workload="resnet18:scale=0.125,image=32,classes=10,buffers=local")) is False
    assert tracing._sends_buffers(flags.build_spec(workload="resnet18:scale=0.125,image=32,classes=10")) is True
    trace.update({"broadcast_buffers": False, "job": {**trace["job"], "workload": "replay", "workload_options": {}}})
    tracefile.save(trace, str(path))
    replay = flags.build_spec(replay=str(path), steps="2").workload_options
    assert workloads.build("replay", replay, seed=0, rank=0, batch_size=16).broadcast_buffers is False
    assert workloads.build("cnn", {}, seed=0, rank=0, batch_size=4).broadcast_buffers is True
    assert workloads.build("resnet18", {"scale": 0.125, "image": 32, "classes": 10, "buffers": "local"}, seed=0, rank=0,
                           batch_size=4).broadcast_buffers is False


def _run_trace(run_id: str, ready: tuple[float, float], step_s: float, layouts=("0", "1"), order=(0, 1),
               gathered: int = 0) -> dict:
    """A hand-made trace of a run: one rank, one step, two buckets (DDP's 0 and 1) of the
    parameters a and b, listed in ``order``; ``layouts``: the numbers this run gave the two
    buckets' layouts; ``gathered``: bytes bucket 1 gathered (a sparsifier's, which vary by run)."""
    buckets = [{"seq": i, "bucket": i, "layout": int(layouts[i]), "numel": n, "sent": None, "rounds": 1,
                "reduce_calls": 1, "gather_calls": 2 if i and gathered else 0, "reduce_bytes": 4 * n,
                "gather_bytes": gathered if i else 0, "ready_s": ready[i], "encode_s": 0.001 * (i + 1),
                "decode_s": 0.0005, "start_s": ready[i], "done_s": ready[i] + 0.01}
               for i, n in enumerate((10, 20))]
    return {"format": tracefile.FORMAT, "version": tracefile.VERSION, "recorded": {"run_id": run_id, "host": "h"},
            "job": {"compressor": "none", "compressor_options": {}, "workload": "mlp", "workload_options": {},
                    "nodes": 1, "batch_size": 16, "bucket_cap_mb": 0.0001, "mode": "overlap", "comm": "allreduce",
                    "comm_options": {}, "optimizer": "sgd", "steps": 1, "bw_bps": 1e9, "seed": 0},
            "parameters": [["module.a", [10]], ["module.b", [20]]],
            "layouts": {"0": {layouts[0]: [["module.a", [10]]], layouts[1]: [["module.b", [20]]]}},
            "ranks": [{"rank": 0, "steps": [{"step": 0, "step_s": step_s, "compute_s": step_s / 2, "forward_s": None,
                                             "optim_s": 0.001, "encode_s": 0.003, "decode_s": None, "comm_s": None,
                                             "sync_s": None, "buckets": [buckets[i] for i in order]}]}]}


def test_a_trace_of_several_runs_takes_each_time_as_their_median():
    """Golden case by hand: three runs' ready times (10, 60, 20 ms for bucket 0; 40, 45, 90 ms for
    bucket 1) and step times (100, 130, 110 ms) merge into 20 and 45 ms and 110 ms (planted: the
    mean gives 30, 58.3 and 113.3 ms); a time one run lacks stays null; the buckets are matched by
    DDP's index and their parameters, not by the layout numbers each run gave them or the order it
    listed them in (the third did both the other way round); sizes are the median run's."""
    from gctestbed import trace
    runs = [_run_trace("r1", (0.010, 0.040), 0.100, gathered=300), _run_trace("r2", (0.060, 0.045), 0.130, gathered=100),
            _run_trace("r3", (0.020, 0.090), 0.110, layouts=("1", "0"), order=(1, 0), gathered=200)]
    runs[1]["ranks"][0]["steps"][0]["forward_s"] = 0.01
    merged = trace.merge(runs)
    step = merged["ranks"][0]["steps"][0]
    buckets = sorted(step["buckets"], key=lambda b: b["bucket"])      # in the median run's (r3's) order
    assert [b["ready_s"] for b in buckets] == [0.020, 0.045]
    assert (step["step_s"], step["compute_s"], step["forward_s"]) == (0.110, 0.055, None)
    assert [b["done_s"] for b in buckets] == pytest.approx([0.030, 0.055])
    assert merged["recorded"]["merged_from"] == ["r1", "r2", "r3"] and runs[0]["ranks"][0]["steps"][0]["step_s"] == 0.100
    assert buckets[1]["gather_bytes"] == 200                           # r3's: the median of 300, 100 and 200 bytes
    assert trace.merge(runs[:1]) is runs[0]
    swapped = _run_trace("r5", (0.01, 0.02), 0.1)
    swapped["layouts"]["0"] = {"0": [["module.b", [20]]], "1": [["module.a", [10]]]}     # bucket 0 held b here
    with pytest.raises(UserError, match="exchanged other buckets"):
        trace.merge([runs[0], swapped])


def test_a_merged_buckets_times_stay_in_order():
    """Medians of sums are not sums of medians: three runs whose (start, encode, end) are (0, 50,
    50), (50, 0, 50) and (50, 50, 100) ms would merge, time by time, to start 50, encode 50 and end
    50 ms, a collective of -50 ms (planted: each time its own median). Rebuilt from the medians of
    the wait, encode, collective and decode, every bucket begins after it was ready and ends after
    its encode and decode."""
    from gctestbed import trace
    runs = []
    for i, (start, encode, done) in enumerate(((0.0, 0.05, 0.05), (0.05, 0.0, 0.05), (0.05, 0.05, 0.10))):
        t = _run_trace(f"r{i}", (0.0, 0.0), 0.2)
        for b in t["ranks"][0]["steps"][0]["buckets"]:
            b.update(ready_s=0.0, start_s=start, encode_s=encode, decode_s=0.0, done_s=done)
        runs.append(t)
    for b in trace.merge(runs)["ranks"][0]["steps"][0]["buckets"]:
        assert b["ready_s"] <= b["start_s"] and b["start_s"] + b["encode_s"] + b["decode_s"] <= b["done_s"], b

def test_runs_merge_only_when_they_are_one_job():
    """Seeds, evaluations and bookkeeping may differ between merged runs; anything that changes the
    times a trace holds (here the CPUs per node, the kernels) may not."""
    from gctestbed import trace
    from gctestbed.spec import LinkSpec, RunSpec
    base = RunSpec(nodes=2, link=LinkSpec(bw_bps=10**9), steps=4, run_id="a")
    trace.mergeable([base, base.replace(seed=7, eval_every=2, run_id="b", results_dir="elsewhere")])
    with pytest.raises(UserError, match="run c differs from run a in cpus_per_node"):
        trace.mergeable([base, base.replace(cpus_per_node=1, run_id="c")])
    with pytest.raises(UserError, match="in kernels"):
        trace.mergeable([base, base.replace(kernels="torch", run_id="d")])
    with pytest.raises(UserError, match="run e differs from run a in compressor"):
        trace.mergeable([base, base.replace(compressor="fp16", run_id="e")])
    here = {"host": "h", "cpu": "x", "cpus": 2, "torch": "2.13.0"}
    trace.mergeable([base, base.replace(run_id="f")], [here, dict(here)])
    with pytest.raises(UserError, match="run g differs from run a in host, torch"):
        trace.mergeable([base, base.replace(run_id="g")], [here, {**here, "host": "g", "torch": "2.12.0"}])
