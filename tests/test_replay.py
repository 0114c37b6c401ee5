"""A replay forms the recorded buckets and releases each when the recorded run's hook got it.

The recorded ready times come from one run's hook; the replayed ones from another run's hook,
measured by that run (the replay's own store), not from the replay workload's schedule. Bytes
are checked on the real method's payload in both runs."""

from __future__ import annotations

import csv
import json
import math
import sqlite3
import statistics

import pytest

from gctestbed import flags, trace
from gctestbed.spec import SpecError
from helpers import gctestbed, here, show

RUN = dict(nodes="2", bw="1gbit", steps="8", bucket_cap_mb="1", batch_size="256")     # calibration off (kept_runs)
WORKLOAD = "mlp:width=1024,depth=3,input_dim=1024"      # 3.2 M parameters: three weights of 4 MB, a bucket each


def _record(results_dir, path, *run_ids: str) -> None:
    """gctestbed trace record, in this process (tests/test_startup.py runs it as a command of its own)."""
    here("trace", "record", *run_ids, "--results", results_dir, "-o", path, check=True)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, kept):
    """One real run of RUN (none) and its trace, shared by the tests that replay it as recorded
    (they only read them): (the run's results directory, the trace's path)."""
    base = tmp_path_factory.mktemp("recorded")
    kept(**RUN, workload=WORKLOAD, results_dir=str(base / "real"))
    path = str(base / "t.json")
    _record(base / "real", path)
    return base / "real", path


def _ready(results_dir) -> dict[tuple[int, int, int], tuple[float, int]]:
    """(rank, step, seq) -> (ready_s, payload bytes) of the latest run in ``results_dir``."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        run_id = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        return {(r, s, q): (t, b) for r, s, q, t, b in conn.execute(
            "SELECT rank, step, seq, ready_s, payload_bytes FROM exchanges WHERE run_id=?", (run_id,))}
    finally:
        conn.close()


def _release_errors(real, replayed, p: int, scale: float = 1.0) -> tuple[dict[tuple[int, int], float], float]:
    """Per replayed (rank, bucket): the median over the steps after DDP's first two of how far its
    ready time was from the recorded one of the same step x ``scale`` (rank r replays recorded rank
    r mod ``p``, step s the recorded step s, so a step's own noise is replayed too); and the spread of
    the recorded ready times (the latest bucket's median less the earliest's), the scale errors are
    judged on. Step by step, not median against median: one late step moves a median of six by as
    much as it was late (CI, 29 November: 10.0 ms in a 32 ms spread, every step within 2 ms but one)."""
    slots = sorted({(r, q) for r, s, q in replayed if s >= 2})
    errors = {(r, q): statistics.median(abs(t - scale * real[(r % p, s, q)][0])
                                        for (r2, s, q2), (t, _) in replayed.items() if (r2, q2) == (r, q) and s >= 2)
              for r, q in slots}
    recorded = [statistics.median(t for (r, s, q2), (t, _) in real.items() if (r, q2) == slot and s >= 2)
                for slot in sorted({(r, q) for r, s, q in real if s >= 2})]
    return errors, scale * (max(recorded) - min(recorded))


@pytest.mark.root
@pytest.mark.slow
def test_a_replay_releases_the_recorded_buckets_at_the_recorded_times(tmp_path, kept, recorded):
    real_dir, path = recorded
    kept(**RUN, workload=f"replay:trace={path}", results_dir=str(tmp_path / "replay"))
    real, replayed = _ready(real_dir), _ready(tmp_path / "replay")
    assert real.keys() == replayed.keys()
    assert all(real[k][1] == replayed[k][1] for k in real)              # the same buckets, the same payloads
    errors, spread = _release_errors(real, replayed, 2)
    assert len(errors) > 2 * 2, "the recorded run exchanged one bucket a step: nothing to order"
    # released when recorded: every bucket within a fifth of the spread of the recorded ready times (0.05
    # to 0.06 in three runs on 29 November; planted, every bucket released at backward's end, 0.72)
    assert max(errors.values()) <= 0.2 * spread, (errors, spread)

    # optim=recorded: every step's optimizer takes the recorded rank's time that step x scale, as the
    # replay's own store measured it (the real SGD on these 3.2 M parameters takes about a third of that)
    kept(**RUN, workload=f"replay:trace={path},compute=sleep,optim=recorded,scale=3", results_dir=str(tmp_path / "optim"))
    trace = json.loads(open(path).read())
    recorded = {(r["rank"], s["step"]): s["optim_s"] for r in trace["ranks"] for s in r["steps"]}
    conn = sqlite3.connect(tmp_path / "optim" / "gctestbed.sqlite")
    try:
        stored = {(r, s): t for r, s, t in conn.execute("SELECT rank, step, optim_s FROM steps")}
    finally:
        conn.close()
    assert stored.keys() == recorded.keys()
    for key, took in stored.items():
        assert 3 * recorded[key] <= took < 3 * recorded[key] + 0.01, (key, took, recorded[key])


def _layouts(results_dir) -> dict[int, list[str]]:
    """rank -> every bucket layout it exchanged after step 0, as its parameters' names in order."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        run_id = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        params = {(r, l): p for r, l, p in conn.execute("SELECT rank, layout, params FROM layouts WHERE run_id=?", (run_id,))}
        out: dict[int, list[str]] = {}
        for rank, layout in conn.execute("SELECT DISTINCT rank, layout FROM exchanges WHERE run_id=? AND step>0 "
                                         "ORDER BY rank, bucket", (run_id,)):
            out.setdefault(rank, []).append(params[(rank, layout)])
        return out
    finally:
        conn.close()


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("workload", ["cnn:width=8", "transformer:d_model=32,layers=2,heads=2,seq_len=16,corpus_mb=0.1"])
def test_a_replay_makes_ddp_rebuild_the_recorded_buckets(tmp_path, kept, workload):
    """DDP rebuilds its buckets after step 0 in the order gradients arrived there: a replay must hand
    them over in the recorded order, or models whose parameters are not one chain (norms, residuals,
    attention) are bucketed differently and send other messages."""
    small = dict(nodes="2", bw="1gbit", steps="12", bucket_cap_mb="0.01")
    path = str(tmp_path / "t.json")
    kept(**small, workload=workload, results_dir=str(tmp_path / "real"))     # both on the module's kept network
    _record(tmp_path / "real", path)
    kept(**small, workload=f"replay:trace={path}", results_dir=str(tmp_path / "replay"))
    real = _layouts(tmp_path / "real")
    assert len(real[0]) > 2, real                       # several buckets to get right
    assert _layouts(tmp_path / "replay") == real
    # the model's buffers (counted on the model itself) are in the trace, and the replay broadcasts
    # them as DDP does before every forward: the kernel's byte counters see the real run's bytes
    # (found by the fidelity measurement: a cnn replay without them sent 1.8-2.5 % less; planted again)
    from gctestbed import tracefile
    buffers = tracefile.load(path)["buffers"]
    # counted once on the models themselves: cnn:width=8 has 9 batch norms (27 tensors, 1,416 bytes),
    # this transformer 2 tensors of 512 bytes
    count, nbytes = (27, 1416) if workload.startswith("cnn") else (2, 512)
    size = {"int64": 8, "float32": 4, "bool": 1}                  # bytes an element of each dtype takes
    assert len(buffers) == count and sum(math.prod(s) * size[d] for _, s, d in buffers) == nbytes, buffers
    # those are what the workers recorded of their wrapped models (schema 17); a store from before it
    # (the column emptied) gives the same from the model built again
    from gctestbed import results, trace as tracing
    conn = results.connect(str(tmp_path / "real"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracing, "_buffers", None)          # with the record there, no model is built again
        assert tracing.extract(conn, results.find_run(conn, None)["run_id"])["buffers"] == buffers
    conn.execute("UPDATE nodes SET buffers = NULL")
    old = tracing.extract(conn, results.find_run(conn, None)["run_id"])
    conn.close()
    assert (old["buffers"], old["broadcast_buffers"]) == (buffers, True)
    (_, real_sent), (_, sent) = _wire(tmp_path / "real"), _wire(tmp_path / "replay")
    # the median of ten measured steps: one step alone moves by up to 1 % in its ACKs and segments (CI, with
    # flows steered by hash, docs/replay.md), and the medians of four steps a side read 0.7-0.8 % apart in 3 of 5
    # tries here (30 November); the cnn without its buffers was 1.35 % short (planted again at 12 steps)
    assert abs(sent / real_sent - 1) < 0.008, (sent, real_sent)


@pytest.mark.root
@pytest.mark.slow
def test_a_replay_on_more_nodes_replays_rank_r_mod_the_recorded_ranks(tmp_path, kept, recorded):
    """A 2-node trace replayed on 4 nodes: ranks 2 and 3 take recorded ranks 0 and 1 and release
    their buckets when those ranks' hooks got them (nothing per peer is scaled yet). The two
    recorded ranks ran the same compute here, so this cannot tell which recorded rank a new one
    took; it fails when ranks past the trace's have none (planted: rank r without mod -> the run fails)."""
    real_dir, path = recorded                      # 8 steps of 2 nodes; 6 replayed
    args = dict(RUN, nodes="4", steps="6")
    # recorded times x4: four nodes on two cores fall behind the recorded times by a cost of this host's
    # own, more with every bucket (the last one 6.3 ms late in a recorded spread of 15.5 ms in one CI run,
    # 15.1 of 18.4 in another), which does not grow with the recorded times: stretched, the buckets' times
    # stand clear of it, and a release at backward's end (a fixed cost early) is off by most of the spread
    K = 4
    kept(**args, workload=f"replay:trace={path},scale={K}", results_dir=str(tmp_path / "replay"))
    real = {k: v for k, v in _ready(real_dir).items() if k[1] < 6}      # the steps replayed
    replayed = _ready(tmp_path / "replay")
    assert {r for r, _, _ in replayed} == {0, 1, 2, 3}
    errors, spread = _release_errors(real, replayed, 2, K)
    # every bucket within a quarter of the (stretched) spread; on the recorded node count, a fifth. Step
    # by step, 0.04 to 0.11 of a 116-129 ms spread in three runs on 29 November; planted (every bucket
    # released at backward's end), 0.57
    assert {r for r, _ in errors} == {0, 1, 2, 3} and max(errors.values()) <= 0.25 * spread, (errors, spread)
    for rank in range(4):
        # the recorded payloads, step by step (as a set per step: on 2 cores four nodes may hand two
        # buckets ready together to the hook in the other order, which renumbers them; seen once in CI)
        for step in {s for r, s, _ in replayed if r == rank}:
            assert sorted(b for (r, s, _), (_, b) in replayed.items() if r == rank and s == step) == \
                sorted(b for (r, s, _), (_, b) in real.items() if r == rank % 2 and s == step), (rank, step)


def _wire(results_dir) -> tuple[dict[tuple[int, int, int], tuple[int, int]], float]:
    """(rank, step, seq) -> (payload bytes, gathered bytes, each round's tensors) of the latest run, and the bytes a
    node sent on its interface per step after DDP's first two (the kernel's counters): each step's mean over the nodes,
    the median over the steps. Not a median over every node's steps: the ranks send unequal shares (rank 0 some
    1.5 kB more of 87 kB here), and such a median jumps between them."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        run_id = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        payloads = {(r, s, q): (p, g, d) for r, s, q, p, g, d in conn.execute(
            "SELECT rank, step, seq, payload_bytes, gather_bytes, payloads FROM exchanges WHERE run_id=?", (run_id,))}
        sent = [t for (t,) in conn.execute("SELECT AVG(tx_bytes) FROM steps WHERE run_id=? AND step>=2 GROUP BY step",
                                            (run_id,))]
        return payloads, statistics.median(sent)
    finally:
        conn.close()


def _halved(path: str, out: str) -> None:
    """The trace at ``path`` with every bucket's payload halved: the planted bug of the acceptance."""
    from gctestbed import tracefile
    trace = tracefile.load(path)
    for rank in trace["ranks"]:
        for step in rank["steps"]:
            for b in step["buckets"]:
                b["reduce_bytes"] //= 2
                b["gather_bytes"] //= 2
                for r in b.get("payloads") or []:
                    for part in ("reduce", "gather"):
                        r[part] = [[d, n // 2] for d, n in r.get(part, [])]
    tracefile.save(trace, out)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("method", ["twobit", "powersgd"])
def test_a_recorded_codec_puts_the_recorded_bytes_on_the_wire(tmp_path, kept, method):
    """codec=recorded: no arithmetic of the method runs, yet every bucket's payload is the recorded
    one and the interface counters (the kernel's, not the codec's accounting) see the recorded
    run's bytes per step within 2 %. A trace with its payloads halved, replayed the same way,
    fails that check: the acceptance's planted bug, kept as part of the test."""
    args = dict(nodes="2", bw="1gbit", steps="6", bucket_cap_mb="1", batch_size="64")
    # the three runs on the module's kept network, as a sweep's cells
    kept(**args, compressor=method, workload=WORKLOAD, results_dir=str(tmp_path / "real"))
    path, halved = str(tmp_path / "t.json"), str(tmp_path / "half.json")
    _record(tmp_path / "real", path)
    _halved(path, halved)
    real_payloads, real_sent = _wire(tmp_path / "real")

    def replay(trace: str, results: str):
        kept(**args, replay=f"{trace},codec=recorded", results_dir=str(tmp_path / results))
        return _wire(tmp_path / results)

    payloads, sent = replay(path, "replay")
    assert payloads == real_payloads
    assert abs(sent / real_sent - 1) <= 0.02, (sent, real_sent)
    payloads, sent = replay(halved, "halved")
    assert payloads != real_payloads and abs(sent / real_sent - 1) > 0.02, (sent, real_sent)
    shown = show(tmp_path / "replay")
    assert shown["replayed"] == "t.json (compute=sleep, codec=recorded)" and shown["compressor"] == method


@pytest.mark.root
@pytest.mark.slow
def test_a_sweep_replays_a_trace_and_its_report_says_so(tmp_path, recorded, state_dir):
    """sweep --replay: every cell replays the trace (here over two rates, each undilated and
    dilated x2: --dilate takes several K), and the report names the replayed cells, from which
    trace and how, in its cells and on its page, and puts each undilated run against its cell at
    x2 (the dilation test; what it finds is this host's, not asserted)."""
    _, path = recorded                   # the module's trace (t.json), 4 of its 8 steps replayed
    swept = gctestbed("sweep", "--replay", f"{path},compute=spin", "--bw", "200mbit,1gbit", "--steps", "4",
                      "--dilate", "1,2", "--calibrate", "none", "--results", str(tmp_path / "sweep"))
    assert swept.returncode == 0, swept.stderr
    out = tmp_path / "report"
    done = gctestbed("report", str(tmp_path / "sweep"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["cells"] == 4 and report["dilated"] == {"2": 2}
    assert report["replayed"] == ["replay of t.json (compute=spin, codec=real)",
                                  "replay of t.json (compute=spin, codec=real, scale=2)"]
    assert "Replayed cells" in (out / "report.html").read_text()
    tested = report["dilation_test"]
    assert sorted((t["dilate"], t["against"]) for t in tested) == [(1, 2), (1, 2)], tested
    with open(out / "cells.csv") as f:
        rows = list(csv.DictReader(f))
    step = {(r["bw_bps"], r["dilate"]): float(r["step_s"]) for r in rows}
    # each undilated run against its own rate's run at x2, as cells.csv has their step times
    by_rate = {t["cell"].split(", ")[-1]: t["excess"] for t in tested}
    assert by_rate == pytest.approx({"200mbit": step[("200000000", "1.0")] / step[("200000000", "2.0")] - 1,
                                     "1gbit": step[("1000000000", "1.0")] / step[("1000000000", "2.0")] - 1}), by_rate
    marks = {(r["dilate"], r["dilation_paced"]) for r in rows}
    assert {m for d, m in marks if d == "2.0"} == {""} and {m for d, m in marks if d == "1.0"} <= {"0", "1"}
    assert {m for d, m in marks if d == "1.0"}


def _nodes_and_losses(results_dir) -> tuple[dict[int, str], dict[int, list[float]]]:
    """rank -> its replica's parameter digest, and rank -> its loss per step, of the latest run."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        run_id = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        digests = dict(conn.execute("SELECT rank, param_sha256 FROM nodes WHERE run_id=?", (run_id,)))
        losses: dict[int, list[float]] = {}
        for rank, loss in conn.execute("SELECT rank, loss FROM steps WHERE run_id=? ORDER BY rank, step", (run_id,)):
            losses.setdefault(rank, []).append(loss)
        return digests, losses
    finally:
        conn.close()


@pytest.mark.root
@pytest.mark.slow
def test_a_mixed_run_trains_the_real_model_on_rank_0_beside_replayed_ranks(tmp_path, kept, recorded):
    """real=1: rank 0 trains the recorded model for real (its loss is the model's, and falls),
    rank 1 replays (its loss is the replay's, zero) and releases its buckets at the recorded
    times; DDP averages both, so the two replicas end bit-identical (the kernel's digest of each
    rank's parameters, not the replay's bookkeeping). Planted: rank 0 replaying too -> its loss is 0."""
    real_dir, path = recorded
    kept(**RUN, replay=f"{path},real=1", results_dir=str(tmp_path / "mixed"))
    digests, losses = _nodes_and_losses(tmp_path / "mixed")
    assert digests[0] == digests[1] and digests[0]
    assert all(v > 0 for v in losses[0]) and losses[0][-1] < losses[0][0], losses[0]
    assert all(v == 0 for v in losses[1]), losses[1]
    real, replayed = _ready(real_dir), _ready(tmp_path / "mixed")
    errors, spread = _release_errors(real, replayed, 2)
    # rank 0's real compute takes one of the host's two cores from the replaying rank, which then falls
    # behind: step by step 0.03 to 0.19 of the spread in five runs on 29 November (median against median,
    # 0.25 and 0.28 on 26 November); planted (every bucket released at backward's end), 0.51
    assert max(e for (r, _), e in errors.items() if r == 1) <= 0.3 * spread, (errors, spread)


@pytest.mark.root
@pytest.mark.slow
def test_a_mixed_run_of_a_model_with_buffers_starts_and_stays_in_step(tmp_path, kept):
    """A cnn has batch norm's buffers, which DDP sends from rank 0 to every rank at its start: the
    replaying ranks must hold them too (found by review: Gloo aborted on the size mismatch). Both
    replicas end bit-identical (the nodes' own digests). Planted: no buffers on the replaying rank ->
    the run fails."""
    args = dict(nodes="2", bw="1gbit", steps="4", bucket_cap_mb="0.01")
    path = str(tmp_path / "t.json")
    kept(**args, workload="cnn:width=8", results_dir=str(tmp_path / "real"))     # both on the module's kept network
    _record(tmp_path / "real", path)
    kept(**args, replay=f"{path},real=1", results_dir=str(tmp_path / "mixed"))
    digests, losses = _nodes_and_losses(tmp_path / "mixed")
    assert digests[0] == digests[1] and digests[0] and all(v > 0 for v in losses[0])


@pytest.mark.root
@pytest.mark.slow
def test_a_dilated_parameter_server_sums_at_this_hosts_speed(tmp_path, kept):
    """Dilated by K, a replay's recorded times take K times as long; a parameter server's sums are
    this host's own work, so they must too, or the emulated server would sum K times faster than
    this host can (as a method's codec run for real would encode: refused under --dilate). A
    replay at K = 4 stores about 4 times the undilated replay's summing time (its emulated time the
    same: within 0.6 to 1.6 here). Planted (not stretched): about a quarter, fails."""
    ps = dict(nodes="2", bw="1gbit", steps="6", comm="ps")
    small = "mlp:width=512,depth=2,input_dim=256"
    kept(**ps, compressor="twobit", workload=small, results_dir=str(tmp_path / "real"))
    _record(tmp_path / "real", tmp_path / "t.json")
    kept(**ps, replay=f"{tmp_path / 't.json'},codec=recorded,optim=recorded", results_dir=str(tmp_path / "k1"))
    kept(**ps, replay=f"{tmp_path / 't.json'},codec=recorded,optim=recorded", dilate="4",
         results_dir=str(tmp_path / "k4"))
    undilated, dilated = _server(tmp_path / "k1", "sum_s"), _server(tmp_path / "k4", "sum_s")
    assert 0.6 < dilated / 4 / undilated < 1.6, (dilated, undilated)


def test_a_trace_directory_stands_for_each_methods_own_trace(tmp_path):
    """A sweep over methods replays each method's own trace of one model: trace=DIR takes, per run,
    the one trace in DIR recorded with the run's method and options (here the GPU traces shipped
    with gctestbed, named @h200/evening wherever it is installed). A method DIR holds no trace of,
    or two of, is one sentence naming what it holds. Planted (the first trace in DIR whatever the
    method): the twobit run replays none's, fails."""
    import os
    import shutil
    import gctestbed as package
    from gctestbed import tracefile
    evening = os.path.join(os.path.dirname(package.__file__), "traces", "h200", "evening")
    assert tracefile.path_of("@h200/evening") == evening
    replay = "@h200/evening,compute=sleep,codec=recorded"
    none = flags.build_spec(nodes="2", steps="10", replay=replay)
    two = flags.build_spec(nodes="2", steps="10", compressor="twobit:threshold=0.001", replay=replay)
    assert os.path.basename(none.workload_options["trace"]) == "mlp-none-1gbit.json.gz" and none.compressor == "none"
    assert os.path.basename(two.workload_options["trace"]) == "mlp-twobit-1gbit.json.gz"
    assert (two.compressor, two.compressor_options) == ("twobit", {"residual": True, "threshold": 0.001})
    with pytest.raises(SpecError, match=r"holds no trace of twobit with options residual=True, threshold=0.5; it holds: "
                                        r".*twobit:residual=True,threshold=0.001\."):
        flags.build_spec(nodes="2", steps="10", compressor="twobit:threshold=0.5", replay=replay)
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        shutil.copy(os.path.join(evening, "mlp-none-1gbit.json.gz"), twice / name)
    with pytest.raises(SpecError, match="holds 2 traces of none with these options"):
        flags.build_spec(nodes="2", steps="10", replay=f"{twice},compute=sleep")
    # the directory is read again when a file in it changes, even with its old times put back (planted:
    # the first reading kept): b becomes 2-bit's trace and none's is a's alone
    stat = os.stat(twice / "b.json.gz")
    shutil.copy(os.path.join(evening, "mlp-twobit-1gbit.json.gz"), twice / "b.json.gz")
    os.utime(twice / "b.json.gz", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert flags.build_spec(nodes="2", steps="10", replay=f"{twice},compute=sleep").workload_options["trace"].endswith("a.json.gz")
    mixed = tmp_path / "mixed"              # one job's traces only: another model's 2-bit would be compared with this none
    mixed.mkdir()
    shutil.copy(os.path.join(evening, "mlp-none-1gbit.json.gz"), mixed)
    shutil.copy(os.path.join(evening, "..", "cnn-dgc-1gbit.json.gz"), mixed)
    with pytest.raises(SpecError, match="holds traces of different jobs or devices"):
        flags.build_spec(nodes="2", steps="10", replay=f"{mixed},compute=sleep")
    # a worker pushes what a ring's trace sent in one round (none, fp16, 2-bit, DGC), not PowerSGD's two rounds
    assert flags.one_round(tracefile.load(two.workload_options["trace"]))
    assert not flags.one_round(tracefile.load(os.path.join(evening, "mlp-powersgd-1gbit.json.gz")))
    pushed = flags.build_spec(nodes="2", steps="10", comm="ps", compressor="twobit:threshold=0.001", replay=replay)
    assert (pushed.comm, pushed.comm_options["servers"], pushed.comm_options["pull"]) == ("ps", 1, "dense")


def _server(results_dir, column: str = "rx_bytes") -> float:
    """A column of the parameter server's steps as stored, median after step 1: ``rx_bytes``, its
    interface's bytes received (its eth0 counters), or ``sum_s``, its summing time (host seconds)."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        return statistics.median(r for (r,) in conn.execute(f"SELECT {column} FROM server_steps WHERE step>=2"))
    finally:
        conn.close()


@pytest.mark.root
@pytest.mark.slow
def test_a_replay_over_parameter_servers_pushes_the_recorded_payloads(tmp_path, kept):
    """A trace of twobit pushed to a parameter server (MXNet's arrangement), replayed with
    codec=recorded over --comm ps: the server's interface receives what it received from the real
    run (within 1 %, its kernel counters). A trace with halved payloads does not pass: the server
    decodes every push with the method's own rule, and half a twobit payload is too short for its
    elements, so that run stops. Replaying it over the ring is refused: its payloads were pushes. A
    ring's trace of the same job pushes its payloads to the server as the real run did (within 1 %)."""
    ps = dict(nodes="2", bw="1gbit", steps="6", comm="ps")       # the three runs on the module's kept network
    small = "mlp:width=512,depth=2,input_dim=256"
    kept(**ps, compressor="twobit", workload=small, results_dir=str(tmp_path / "real"))
    _record(tmp_path / "real", tmp_path / "t.json")      # as run --record-trace writes it (tests/test_trace.py)
    # --record-trace takes a run over parameter servers, as trace record just did (local SGD's refusal: test_trace.py)
    assert trace.untraceable(flags.build_spec(**ps, compressor="twobit", workload=small)) is None
    _halved(str(tmp_path / "t.json"), str(tmp_path / "half.json"))
    kept(**ps, replay=f"{tmp_path / 't.json'},codec=recorded", results_dir=str(tmp_path / "t"))
    real, replayed = _server(tmp_path / "real"), _server(tmp_path / "t")
    assert abs(replayed / real - 1) < 0.01, (replayed, real)
    with pytest.raises(AssertionError, match="fewer than the"):          # the planted bug: the run fails
        kept(**ps, replay=f"{tmp_path / 'half.json'},codec=recorded", results_dir=str(tmp_path / "half"))
    # a ring's trace of the same job: each bucket's one payload is what a worker pushes, so it replays over
    # ps too (how the claims replay GPU traces in MXNet's arrangement), the server receiving what the real
    # parameter-server run's did; halved, the server's decode stops it
    ring_run = dict(ps, comm="allreduce")
    kept(**ring_run, compressor="twobit", workload=small, results_dir=str(tmp_path / "ring-real"))
    _record(tmp_path / "ring-real", tmp_path / "ring.json")
    _halved(str(tmp_path / "ring.json"), str(tmp_path / "ring-half.json"))
    kept(**ps, replay=f"{tmp_path / 'ring.json'},codec=recorded", results_dir=str(tmp_path / "pushed"))
    pushed = _server(tmp_path / "pushed")
    assert abs(pushed / real - 1) < 0.01, (pushed, real)
    with pytest.raises(AssertionError, match="fewer than the"):
        kept(**ps, replay=f"{tmp_path / 'ring-half.json'},codec=recorded", results_dir=str(tmp_path / "ring-half"))
    # the refusals: one through the command line (exit 2, one sentence), the others where it makes the spec
    ring = here("run", "--nodes", "2", "--steps", "6", "--replay", f"{tmp_path / 't.json'},codec=recorded",
                "--results", tmp_path / "ring")
    assert ring.returncode == 2 and "replay it over the same --comm" in ring.stderr, ring.stderr
    assert len(ring.stderr.strip().splitlines()) == 1 and "Traceback" not in ring.stderr, ring.stderr
    # pushes split over two servers, or pulled compressed, are not what the trace sent: refused (they crashed)
    for comm in ("ps:servers=2", "ps:pull=compressed"):
        with pytest.raises(SpecError, match="of one server with dense pulls"):
            flags.build_spec(nodes="2", steps="6", comm=comm, replay=f"{tmp_path / 't.json'},codec=recorded",
                             results_dir=str(tmp_path / "other"))
