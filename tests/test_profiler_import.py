"""A torch.profiler trace of a DDP job, imported as a trace (gctestbed/profiler_import.py).

The job is profiled here for real (one rank, Gloo) with known pauses in its forward and
backward (helpers.PausedChain) and a known optimizer pause; the imported times are held against
those pauses, and the buckets against sizes worked by hand from the layers, not against the code."""

from __future__ import annotations

import json
import time

import pytest
import torch

from gctestbed import profiler_import, trace, tracefile
from gctestbed.spec import UserError
from helpers import BACKWARD_S, FORWARD_S, PausedChain, gctestbed

OPTIM_S = 0.02
FIRST = 64 * 256 + 256           # the first layer's elements: the bucket backward releases last
SECOND = 256 * 300 + 300         # the second's, released first; both under DDP's default first-bucket 1 MiB


def _profile(path, steps: int = 3, record_shapes: bool = True, batch_norm: bool = False, skip: int = 0) -> None:
    """Profile ``steps`` steps of a one-rank DDP job, after ``skip`` unprofiled ones (a profiler
    schedule, as a user profiles a job past its start), and write its Chrome trace to ``path``."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule
    first = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256, affine=False)) if batch_norm \
        else torch.nn.Linear(64, 256)
    model = DDP(PausedChain(first, torch.nn.Linear(256, 300)), bucket_cap_mb=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = schedule(wait=skip - 1, warmup=1, active=steps, repeat=1) if skip else None
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes, schedule=plan) as prof:
        for _ in range(skip + steps):
            opt.zero_grad()
            model(torch.rand(8, 64)).sum().backward()
            time.sleep(OPTIM_S)                 # inside the step: between backward and the optimizer
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(path))


def _convert(*paths) -> dict:
    return profiler_import.convert([(str(p), profiler_import.load_profile(str(p))) for p in paths])


def test_a_profiled_ddp_job_imports_as_its_buckets_and_their_times(single_rank_group, tmp_path):
    _profile(tmp_path / "p.json")
    data = _convert(tmp_path / "p.json")
    steps = data["ranks"][0]["steps"]
    assert len(steps) == 3 and data["job"]["nodes"] == 1 and data["job"]["optimizer"] == "sgd"
    # DDP's first step: one bucket of the whole model; later: the second layer's bucket, then the first's
    assert [(b["layout"], b["numel"]) for b in steps[0]["buckets"]] == [(0, FIRST + SECOND)]
    for s in steps[1:]:
        assert [(b["layout"], b["numel"], b["reduce_bytes"]) for b in s["buckets"]] == \
            [(1, SECOND, 4 * SECOND), (2, FIRST, 4 * FIRST)]
        second_at, first_at = (b["ready_s"] for b in s["buckets"])
        # held against the pauses: the second layer's gradients come after the forward's pause, the
        # first's a backward pause later; the forward is its pause; the optimizer waits after backward
        assert FORWARD_S <= s["forward_s"] < FORWARD_S + BACKWARD_S / 2, s["forward_s"]
        assert FORWARD_S <= second_at < FORWARD_S + BACKWARD_S, second_at
        assert first_at - second_at >= BACKWARD_S, (first_at, second_at)
        assert s["compute_s"] >= first_at + OPTIM_S and s["step_s"] >= s["compute_s"] + s["optim_s"] - 1e-9
        assert all(b["done_s"] >= b["ready_s"] for b in s["buckets"])
    # one parameter per bucket, in the model's order, each closing a bucket of its own in a replay's DDP
    assert data["parameters"] == [["module.bucket1", [FIRST]], ["module.bucket0", [SECOND]]]
    assert data["job"]["bucket_cap_mb"] * 2 ** 20 <= 4 * FIRST
    assert data["buffers"] == [] and data["broadcast_buffers"] is False
    # a trace like a recorded one: saved, loaded, described, shown, drawn
    from gctestbed import chrometrace
    from gctestbed.cli.render import trace_table
    tracefile.save(data, str(tmp_path / "t.json.gz"))
    about = trace.describe(tracefile.load(str(tmp_path / "t.json.gz")))
    assert about["elements"] == FIRST + SECOND and about["ranks"][0]["bytes"] == 4 * (FIRST + SECOND)
    assert "imported from torch.profiler (p.json)" in trace_table(about).title
    drawn = chrometrace.events(tracefile.load(str(tmp_path / "t.json.gz")))["traceEvents"]
    # each step's forward and optimizer, and every bucket's collective: 1 + 2 + 2 of them
    names = [e["name"] for e in drawn if e.get("ph") == "X"]
    assert (names.count("forward"), names.count("optimizer"), names.count("collective")) == (3, 3, 5), names


def test_an_imported_trace_is_replayed_only_where_ddp_forms_its_buckets(single_rank_group, tmp_path, monkeypatch):
    """Its first bucket (the second layer's, 308 KB) is under the 1 MiB an older DDP holds its first
    bucket to whatever cap it is given: such a torch would join it to the next, so the replay is
    refused there in one sentence; torch 2.13's DDP (which has _BucketCapacityConfig) takes it."""
    import torch.nn.parallel.distributed as ddp
    from gctestbed import flags
    from gctestbed.spec import SpecError
    _profile(tmp_path / "p.json")
    tracefile.save(_convert(tmp_path / "p.json"), str(tmp_path / "t.json"))
    spec = flags.build_spec(workload=f"replay:trace={tmp_path / 't.json'}", nodes="2", steps="3", calibrate=False)
    assert spec.bucket_cap_mb * 2 ** 20 == 4 * FIRST
    monkeypatch.delattr(ddp, "_BucketCapacityConfig")
    with pytest.raises(SpecError, match="holds its first bucket to 1 MiB"):
        flags.build_spec(workload=f"replay:trace={tmp_path / 't.json'}", nodes="2", steps="3", calibrate=False)
    # and by a node whose torch is older than the controller's (docker, hosts, Slurm): where it builds the model
    from gctestbed.workloads import replay
    with pytest.raises(UserError, match="holds its first bucket to 1 MiB"):
        replay.build(replay.ReplayOptions(trace=str(tmp_path / "t.json")), seed=0, rank=0, batch_size=8)


def test_each_ranks_profile_is_a_rank_of_the_trace(single_rank_group, tmp_path):
    """Two ranks' files (one profile given rank 1 of 2 by hand: one process here) make a trace of
    two ranks in rank order, whichever order they are given in; one rank twice is refused."""
    _profile(tmp_path / "p.json")
    prof = profiler_import.load_profile(str(tmp_path / "p.json"))
    ranks = [json.loads(json.dumps(prof)) for _ in range(2)]
    for r, p in enumerate(ranks):
        p["distributedInfo"] = {**p.get("distributedInfo", {}), "rank": r, "world_size": 2}
    data = profiler_import.convert([("r1.json", ranks[1]), ("r0.json", ranks[0])])
    assert data["job"]["nodes"] == 2 and data["recorded"]["files"] == ["r0.json", "r1.json"]
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and sorted(data["layouts"]) == ["0", "1"]
    with pytest.raises(UserError, match="same rank"):
        profiler_import.convert([("a.json", ranks[0]), ("b.json", ranks[0])])


@pytest.mark.parametrize("steps, skip", [(3, 0), (2, 0), (2, 1), (2, 2)])
def test_the_models_buffers_are_what_ddp_broadcast_in_every_forward(single_rank_group, tmp_path, steps, skip):
    """Batch norm's statistics (256 + 256 floats and one int64 count) are broadcast before every
    forward: the trace holds them as one buffer per broadcast, so a replay sends them too. Not
    what DDP's second step also broadcasts (the order of the buckets it rebuilt), whichever of
    the profiled steps that is (planted: the last step of two from the start, or the first of
    two from the second, read two int32 broadcasts more)."""
    _profile(tmp_path / "p.json", steps=steps, skip=skip, batch_norm=True)
    data = _convert(tmp_path / "p.json")
    assert data["buffers"] == [["buffer0", [512], "float32"], ["buffer1", [1], "int64"]] and data["broadcast_buffers"]


def test_broadcasts_gloos_two_threads_started_out_of_order_are_matched_by_size(single_rank_group, tmp_path):
    """Gloo runs its queue on two threads, so the count's broadcast (one int64) can start before the
    statistics' (512 floats) issued just ahead of it, as a loaded CI host once showed: each
    broadcast DDP issued is paired with its own run, not with the next run in time (planted:
    pairing in time order reads the buffers as mismatched)."""
    _profile(tmp_path / "p.json", steps=2, batch_norm=True)
    prof = profiler_import.load_profile(str(tmp_path / "p.json"))
    runs = sorted((e for e in prof["traceEvents"] if e.get("name") == "gloo:broadcast"), key=lambda e: e["ts"])
    stats, count = sorted(runs[:2], key=profiler_import._numel, reverse=True)     # the first forward's two
    assert (profiler_import._numel(stats), profiler_import._numel(count)) == (512, 1)
    issued = sorted((e for e in prof["traceEvents"] if e.get("name") == "c10d::broadcast_"), key=lambda e: e["ts"])
    count_issued = issued[1]                  # the count's, issued just after the statistics'
    assert profiler_import._numel(count_issued) == 1
    # as two threads run them: the count's starts as soon as it is issued, the statistics' just after it
    count["ts"], stats["ts"] = count_issued["ts"], count_issued["ts"] + 1
    data = profiler_import.convert([("p.json", prof)])
    assert data["buffers"] == [["buffer0", [512], "float32"], ["buffer1", [1], "int64"]]


def _run(ts: int, numel: int) -> dict:
    return {"ts": ts, "dur": 1, "args": {"Input Dims": [[numel]]}}


def test_each_collective_issued_takes_the_earliest_later_run_of_its_size():
    """The pairing rule, by hand: issued at 0 (4 elements), 1 (2) and 5 (4); Gloo ran a 2 at 2, a 4
    at 3 and a 4 at 6, with a stray 4 at -1 that began before anything was issued. The first 4 takes
    the run at 3 (not the stray, which began before it), the 2 the run at 2, the last 4 the one at 6;
    the stray is a run never issued. Then the rule against its plain statement (each in turn takes
    the earliest untaken run of its size that began after it) on random profiles, and 20,000
    collectives behind 20,000 stray runs paired in under 5 s of this process's CPU time (the plain
    statement takes about a minute; CPU time, so that other jobs on the host do not count)."""
    import random
    issued = [_run(0, 4), _run(1, 2), _run(5, 4)]
    stray, two, four, last = _run(-1, 4), _run(2, 2), _run(3, 4), _run(6, 4)
    ran = [stray, two, four, last]
    assert profiler_import._pair(issued, ran, every=False) == [four, two, last]
    assert profiler_import._pair(issued, ran) is None                   # the stray was never issued
    assert profiler_import._pair(issued, [two, four, last]) == [four, two, last]
    assert profiler_import._pair(issued + [_run(7, 2)], [two, four, last]) is None     # no run for the last

    def plain(issued, ran, every=True):
        left, out = sorted(ran, key=lambda r: r["ts"]), []
        for e in issued:
            match = next((r for r in left if r["ts"] >= e["ts"] and r["args"]["Input Dims"] == e["args"]["Input Dims"]), None)
            if match is None:
                return None
            left.remove(match)
            out.append(match)
        return None if every and left else out

    rng = random.Random(5)
    for _ in range(300):
        issued = sorted((_run(rng.randrange(40), rng.choice((1, 2, 3))) for _ in range(rng.randrange(1, 8))),
                        key=lambda e: e["ts"])
        ran = [_run(e["ts"] + rng.randrange(4), e["args"]["Input Dims"][0][0]) for e in issued if rng.random() < 0.9]
        ran += [_run(rng.randrange(40), rng.choice((1, 2, 3))) for _ in range(rng.randrange(3))]
        rng.shuffle(ran)
        for every in (True, False):
            got, want = profiler_import._pair(issued, ran, every), plain(issued, ran, every)
            assert (got is None) == (want is None) and (got is None or [id(r) for r in got] == [id(r) for r in want])
    # 20,000 collectives behind 20,000 runs never issued (the plain statement passes over all of them each time)
    many = [_run(t, 1 + t % 3) for t in range(20_000)]
    strays = [_run(-1, 1 + t % 3) for t in range(20_000)]
    began = time.process_time()
    paired = profiler_import._pair(many, strays + [_run(r["ts"] + 1, r["args"]["Input Dims"][0][0]) for r in many],
                                   every=False)
    assert paired is not None and [r["ts"] for r in paired] == [r["ts"] + 1 for r in many]
    assert time.process_time() - began < 5.0          # 0.1-0.2 s here; the quadratic scan took 52 s


def test_a_job_profiled_past_its_start_replays_its_first_step_as_ddp_sends_it(single_rank_group, tmp_path):
    """Profiled from the third step (a profiler schedule): every profiled step has the rebuilt
    buckets, but a replay's DDP sends its first step as one bucket of the whole model, so the
    trace's first step is that bucket, ready when the profiled step's last bucket was."""
    _profile(tmp_path / "p.json", steps=3, skip=2)
    prof = profiler_import.load_profile(str(tmp_path / "p.json"))
    issued = sorted((e for e in prof["traceEvents"] if e.get("name") == "c10d::allreduce_"), key=lambda e: e["ts"])
    assert [profiler_import._numel(e) for e in issued] == [SECOND, FIRST] * 3      # no whole-model step profiled
    steps = _convert(tmp_path / "p.json")["ranks"][0]["steps"]
    [whole] = steps[0]["buckets"]
    assert (whole["layout"], whole["numel"], whole["reduce_bytes"]) == (0, FIRST + SECOND, 4 * (FIRST + SECOND))
    assert whole["ready_s"] >= FORWARD_S + BACKWARD_S                 # the first layer's, a backward pause after
    assert [(b["layout"], b["numel"]) for s in steps[1:] for b in s["buckets"]] == [(1, SECOND), (2, FIRST)] * 2


def test_a_steps_ready_times_count_from_the_end_of_ddps_broadcasts_in_its_forward(single_rank_group, tmp_path):
    """A bucket's ready time and the forward count from the model's own forward, after DDP's buffer
    broadcasts (as the hook records them): the last broadcast of each forward made 2 ms longer by
    hand moves each step's origin 2 ms later, so every ready time and forward is 2 ms shorter and
    done times too, while the step times stay (planted: the origin at the DDP forward's start, or
    at the end of its first broadcast -> they do not move, or move by less)."""
    _profile(tmp_path / "p.json", steps=3, batch_norm=True)
    prof = profiler_import.load_profile(str(tmp_path / "p.json"))
    longer = json.loads(json.dumps(prof))
    spans = sorted((e for e in longer["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    for fwd in (e for e in spans if e["name"] == "DistributedDataParallel.forward"):
        casts = [e for e in spans if e["name"] == "c10d::broadcast_" and fwd["ts"] <= e["ts"] <= fwd["ts"] + fwd["dur"]]
        assert len(casts) >= 2                          # the statistics and the count: the last one is the origin
        casts[-1]["dur"] += 2000
    before, after = (profiler_import.convert([("p.json", p)])["ranks"][0]["steps"] for p in (prof, longer))
    assert len(before) == len(after) == 3
    for a, b in zip(before, after):
        assert b["forward_s"] == pytest.approx(a["forward_s"] - 0.002, abs=1e-9)
        assert b["step_s"] == pytest.approx(a["step_s"], abs=1e-9)
        assert [x["ready_s"] for x in b["buckets"]] == pytest.approx([x["ready_s"] - 0.002 for x in a["buckets"]], abs=1e-9)
        assert [x["done_s"] for x in b["buckets"]] == pytest.approx([x["done_s"] - 0.002 for x in a["buckets"]], abs=1e-9)


def _edited(prof: dict, **where) -> dict:
    """A copy of ``prof`` with each event of a name given changed by the function given for it."""
    out = json.loads(json.dumps(prof))
    for e in out["traceEvents"]:
        if e.get("name") in where:
            where[e["name"]](e)
    return out


def test_what_a_profile_cannot_give_is_refused_in_one_sentence(single_rank_group, tmp_path):
    _profile(tmp_path / "shapeless.json", record_shapes=False)
    with pytest.raises(UserError, match="record_shapes=True"):
        _convert(tmp_path / "shapeless.json")
    _profile(tmp_path / "one.json", steps=1)
    with pytest.raises(UserError, match="two steps or more"):
        _convert(tmp_path / "one.json")
    _profile(tmp_path / "p.json")
    prof = profiler_import.load_profile(str(tmp_path / "p.json"))

    def bf16(e):
        e["args"]["Input type"] = ["c10::BFloat16"]

    def unknown(e):
        e["args"]["Input type"] = ["c10::Float8_e4m3fn"]
    for edited, words in ((_edited(prof, **{"gloo:all_reduce": bf16}), "a replay's parameters are float32"),
                          (_edited(prof, **{"gloo:all_reduce": unknown}), "tensor type is 'c10::Float8_e4m3fn'"),
                          ({**prof, "distributedInfo": {**prof.get("distributedInfo", {}), "backend": "nccl"}}, "NCCL job"),
                          (_edited(prof, **{"gloo:all_reduce": lambda e: e.update(name="other")}), "do not match"),
                          (_edited(prof, **{"gloo:all_reduce": lambda e: e["args"].update({"Input Dims": [[7]]})}),
                           "do not match"),
                          (_edited(prof, **{"gloo:broadcast": lambda e: e.update(name="nccl:broadcast")}), "NCCL job"),
                          (_edited(prof, **{"c10d::allreduce_": lambda e: e.update(name="other") if e["ts"] == max(
                              x["ts"] for x in prof["traceEvents"] if x.get("name") == "c10d::allreduce_") else None,
                              "gloo:all_reduce": lambda e: e.update(name="other") if e["ts"] == max(
                              x["ts"] for x in prof["traceEvents"] if x.get("name") == "gloo:all_reduce") else None}),
                           "different buckets")):
        with pytest.raises(UserError, match=words):
            profiler_import.convert([("p.json", edited)])
    (tmp_path / "other.json").write_text(json.dumps({"schemaVersion": 1}))
    proc = gctestbed("trace", "import", str(tmp_path / "other.json"), "-o", str(tmp_path / "t.json"))
    assert proc.returncode == 2 and "not a Chrome trace of torch.profiler" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "t.json").exists()


@pytest.mark.root
@pytest.mark.slow
def test_a_replay_of_an_imported_profile_sends_its_buckets_when_backward_released_them(single_rank_group, tmp_path, state_dir):
    """Replayed on 2 nodes, the imported job's buckets are formed by the replay's own DDP (its hook
    records them), carry the profiled bytes (the kernel's interface counters against the ring's
    2(p-1)/p x 4 bytes an element), and are released at the profiled ready times (the replay's
    hook's clock against the profile's); a job profiled past its start too, replayed with its
    recorded payloads and optimizer times. Both buckets are under DDP's default first-bucket 1 MiB:
    given a cap, DDP holds its first rebuilt bucket to that cap."""
    import sqlite3
    import statistics
    from helpers import here, kept_runs, show
    _profile(tmp_path / "p.json", steps=6)
    path = str(tmp_path / "t.json")
    here("trace", "import", tmp_path / "p.json", "-o", path, check=True)       # (tests/test_startup.py: as a command)
    with kept_runs() as run:
        run(workload=f"replay:trace={path}", nodes="2", bw="1gbit", steps="6", results_dir=str(tmp_path / "replay"))
        # the recorded payloads and optimizer times, of a job profiled past its start (its first step made
        # one bucket of the whole model, as the replay's DDP sends it)
        _profile(tmp_path / "late.json", steps=6, skip=2)
        late = str(tmp_path / "late-trace.json")
        here("trace", "import", tmp_path / "late.json", "-o", late, check=True)
        run(workload=f"replay:trace={late},codec=recorded,optim=recorded", nodes="2", bw="1gbit", steps="6",
            results_dir=str(tmp_path / "recorded"))
    assert show(tmp_path / "recorded")["wire_bytes_per_step"] / (4 * (FIRST + SECOND)) == pytest.approx(1, abs=0.03)
    conn = sqlite3.connect(tmp_path / "replay" / "gctestbed.sqlite")
    try:
        rows = conn.execute("SELECT e.rank, e.step, e.seq, e.ready_s, e.payload_bytes, l.params FROM exchanges e JOIN layouts l "
                            "ON l.run_id = e.run_id AND l.rank = e.rank AND l.layout = e.layout WHERE e.step >= 2").fetchall()
    finally:
        conn.close()
    assert {(q, b, tuple(name for name, _ in json.loads(p))) for _, _, q, _, b, p in rows} == \
        {(0, 4 * SECOND, ("module.bucket0",)), (1, 4 * FIRST, ("module.bucket1",))}, rows[:4]
    profiled = json.loads(open(path).read())["ranks"][0]["steps"]
    for seq in (0, 1):
        want = statistics.median(s["buckets"][seq]["ready_s"] for s in profiled[2:])
        got = statistics.median(t for _, _, q, t, _, _ in rows if q == seq)
        assert abs(got - want) <= 0.2 * BACKWARD_S, (seq, got, want)
    wire = show(tmp_path / "replay")["wire_bytes_per_step"]
    assert 1.0 <= wire / (4 * (FIRST + SECOND)) < 1.03, wire
