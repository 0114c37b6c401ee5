"""The store keeps every step, summarises from rows alone, and is private to its owner."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

import pytest

from gctestbed import results
from gctestbed.spec import LinkSpec, RunSpec, UserError


def _spec(nodes=2):
    return RunSpec(nodes=nodes, link=LinkSpec(bw_bps=100_000_000), steps=3, batch_size=10, run_id="r1")


def test_summary_from_rows(tmp_path):
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {"kernel": "x"})
    for step in range(3):
        for rank in range(2):
            rec.step(rank, step, step_s=1.0 + rank, compute_s=0.5, optim_s=0.1, comm_s=0.8, loss=2.0 - step,
                     tx_bytes=10_000_000, rx_bytes=10_000_000, payload_bytes=10_000_000, buckets=1)
    rec.node(0, param_sha256="aa")
    rec.node(1, param_sha256="aa")
    rec.finish_run("ok")
    s = results.summarize(rec.conn, results.find_run(rec.conn, "r"))
    assert s.status == "ok" and s.steps_recorded == 3
    assert s.median_step_s == 2.0                      # slowest rank decides a step
    assert s.samples_per_s == 2 * 10 / 2.0
    assert s.busbw_bps == pytest.approx(10_000_000 * 8 / 0.8)   # 2(n-1)/n = 1 for two nodes
    assert s.final_loss == 0.0 and s.params_identical is True


def test_partial_steps_are_not_counted_as_complete(tmp_path):
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {})
    rec.step(0, 0, step_s=1.0)
    rec.step(1, 0, step_s=1.0)
    rec.step(0, 1, step_s=1.0)
    s = results.summarize(rec.conn, results.find_run(rec.conn, None))
    assert s.steps_recorded == 1 and s.status == "running"


def test_unknown_step_field_is_refused(tmp_path):
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {})
    with pytest.raises(KeyError):
        rec.step(0, 0, step_s=1.0, bogus=1)


def test_store_is_private_and_in_wal_mode(tmp_path):
    conn = results.connect(str(tmp_path))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert stat.S_IMODE(os.stat(results.db_path(str(tmp_path))).st_mode) == 0o600


def _open_at_once(results_dir, barrier, failures):
    barrier.wait()
    try:
        results.check_writable(results_dir)
    except Exception as e:          # noqa: BLE001 - reported to the parent, which fails the test
        failures.put(str(e))


def test_runs_started_together_on_a_new_results_directory_all_open_its_store(tmp_path):
    """SQLite refuses the switch to WAL at once (no waiting) to a process racing another that is
    switching the fresh file; seen in CI as two runs started on one new directory, one refused.
    Three processes open each of 60 fresh stores at the same instant."""
    ctx = multiprocessing.get_context("fork")
    failures = ctx.Queue()
    for i in range(60):
        barrier = ctx.Barrier(3)
        procs = [ctx.Process(target=_open_at_once, args=(str(tmp_path / str(i)), barrier, failures)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    seen = []
    while not failures.empty():
        seen.append(failures.get())
    assert seen == []


def test_a_step_is_recorded_whole_or_not_at_all(tmp_path):
    """A step row lands with its exchanges in one transaction: a node that fails between the two
    leaves no step without its exchanges."""
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {})
    broken = _exchange(start_s=0.12, done_s=0.3, payloads=None)
    del broken["encode_s"]                     # fails after the step's own row was written
    with pytest.raises(KeyError):
        rec.step(0, 0, step_s=1.0, exchanges=[broken])
    assert results.store.steps_per_rank(rec.conn, "r1") == {}
    rec.step(0, 0, step_s=1.0, exchanges=[_exchange(start_s=0.12, done_s=0.3, payloads=None)])
    assert results.store.steps_per_rank(rec.conn, "r1") == {0: 1}


def test_a_full_store_says_so_and_leaves_no_transaction_open(tmp_path):
    """SQLite rolls a transaction back itself when the disk fills: the error told is SQLite's
    ("database or disk is full"), not that of a second rollback, and the next write starts clean."""
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {})
    pages = rec.conn.execute("PRAGMA page_count").fetchone()[0]
    rec.conn.execute(f"PRAGMA max_page_count={pages}")          # no room for one more page
    many = [_exchange(seq=i, start_s=0.1, done_s=0.2, payloads=list(range(200))) for i in range(200)]
    with pytest.raises(results.StoreError, match="database or disk is full") as raised:
        rec.step(0, 0, step_s=1.0, exchanges=many)
    assert "rollback" not in str(raised.value) and not rec.conn.in_transaction
    rec.conn.execute("PRAGMA max_page_count=1073741823")
    rec.step(0, 0, step_s=1.0)
    assert results.store.steps_per_rank(rec.conn, "r1") == {0: 1}


def test_unknown_run_is_a_user_error(tmp_path):
    conn = results.connect(str(tmp_path))
    with pytest.raises(UserError, match="no runs yet"):
        results.find_run(conn, None)
    with pytest.raises(UserError, match="no run matches"):
        results.find_run(conn, "zzz")


def _exchange(**extra):
    return {"seq": 0, "bucket": 0, "layout": 0, "numel": 10, "sent": None, "rounds": 1, "reduce_calls": 1,
            "gather_calls": 0, "payload_bytes": 20, "gather_bytes": 0, "expected_tx_bytes": 20, "ready_s": 0.1,
            "encode_s": 0.01, "decode_s": 0.02, **extra}


def test_a_store_of_schema_13_gains_the_exchanges_timeline_and_keeps_its_rows(tmp_path):
    """Written before start_s, done_s and payloads (schema 14), behind_s (15) and a calibrated
    path's congestion control (19) existed, a store opened now has the columns, its old rows read
    them as null, and new rows keep them."""
    import sqlite3
    old_schema = "\n".join(line for line in results.SCHEMA.splitlines()
                           if not line.strip().startswith(("start_s", "done_s", "payloads", "behind_s", "congestion")))
    path = results.db_path(str(tmp_path))
    conn = sqlite3.connect(path)
    conn.executescript(old_schema)
    conn.execute("PRAGMA user_version=13")
    conn.execute("INSERT INTO runs (run_id, created_at, status, spec) VALUES ('old', 0, 'ok', '{}')")
    conn.execute("INSERT INTO exchanges (run_id, rank, step, seq, bucket, layout, numel, rounds, reduce_calls, "
                 "gather_calls, payload_bytes, gather_bytes, expected_tx_bytes) VALUES ('old', 0, 0, 0, 0, 0, 10, 1, 1, "
                 "0, 40, 0, 40)")
    conn.execute("INSERT INTO calibrations (run_id, t, src, dst, tool, target_bps, target_rtt_s) "
                 "VALUES ('old', 0, 0, 1, 'iperf3', 1000, 0.01)")
    conn.commit()
    conn.close()

    rec = results.Recorder(str(tmp_path), "r1")
    assert rec.conn.execute("PRAGMA user_version").fetchone()[0] == results.SCHEMA_VERSION
    old = results.exchanges_of(rec.conn, "old")
    assert [(e["start_s"], e["done_s"], e["payloads"]) for e in old] == [(None, None, None)]
    rec.start_run(_spec(), {})
    wire = [{"reduce": [["float16", 10]], "gather": []}, {"reduce": [], "gather": [["uint8", 4], ["int32", 1]]}]
    rec.step(0, 0, step_s=1.0, exchanges=[_exchange(start_s=0.12, done_s=0.3, payloads=wire)])
    new = results.exchanges_of(rec.conn, "r1")
    assert [(e["start_s"], e["done_s"], e["payloads"]) for e in new] == [(0.12, 0.3, wire)]
    rec.step(0, 1, step_s=1.0, behind_s=0.004)
    assert [r["behind_s"] for r in results.step_rows(rec.conn, "r1")] == [None, 0.004]
    from gctestbed.net.calibrate import PathResult
    from gctestbed.results import store
    rec.calibration(PathResult(0, 1, "iperf3", 1000, 0.01, 990.0, 980.0, 0.01, 0.011, congestion="cubic").to_dict())
    assert [c["congestion"] for c in store.calibrations_of(rec.conn, "old")] == [None]
    assert [c["congestion"] for c in store.calibrations_of(rec.conn, "r1")] == ["cubic"]
    # and a run copied to another store (a host's into a sweep's) keeps them
    other = results.connect(str(tmp_path / "other"))
    assert results.copy_run(rec.conn, other, "r1")
    assert results.exchanges_of(other, "r1") == new


def test_rows_from_a_newer_host_keep_what_this_store_has_and_name_the_rest(tmp_path, capsys):
    """A host running a newer gctestbed sends rank rows with a column this store's schema lacks (as
    the nodes' buffers column once broke an older rank 0's import): the rows are stored with the
    columns the store has, and the run's environment names the one it could not keep (planted:
    inserting every column, the whole import fails with sqlite's "no column" error)."""
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(_spec(), {})
    rec.step(0, 0, step_s=1.0)
    exported = results.export_rank(rec.conn, "r1", 0)
    newer = {**exported, "steps": [{**row, "rank": 1, "from_the_future": 7} for row in exported["steps"]]}
    results.import_rows(rec.conn, [newer])
    assert sorted(r["rank"] for r in results.step_rows(rec.conn, "r1")) == [0, 1]
    env = json.loads(results.find_run(rec.conn, "r1")["environment"])
    assert env["columns_not_stored"] == ["steps.from_the_future"]
    from gctestbed.cli import render
    render.print_summary(results.summarize(rec.conn, results.find_run(rec.conn, "r1")))
    assert "a newer host's steps.from_the_future" in " ".join(capsys.readouterr().out.split())
    # a later import adds to the note (a table this store does not have, too), never replaces it
    results.import_rows(rec.conn, [{"steps": [], "from_a_table_to_come": [{"run_id": "r1", "rank": 2}]}])
    assert json.loads(results.find_run(rec.conn, "r1")["environment"])["columns_not_stored"] == [
        "from_a_table_to_come.*", "steps.from_the_future"]
    # a copy into another store of this schema keeps both ranks; the note travels in the environment
    other = results.connect(str(tmp_path / "other"))
    assert results.copy_run(rec.conn, other, "r1")
    assert len(results.step_rows(other, "r1")) == 2
    assert json.loads(results.find_run(other, "r1")["environment"])["columns_not_stored"] == [
        "from_a_table_to_come.*", "steps.from_the_future"]
    rec.close()
    other.close()


@pytest.mark.parametrize("late, flagged", [(0.005, True), (0.001, False), (None, None)])
def test_a_replay_that_fell_behind_its_trace_is_called_host_bound(tmp_path, late, flagged):
    """Worked by hand: steps of 0.1 s (the slowest rank's), one rank 5 ms late a step -> 5 % of
    the step, over the 2 % share: host-bound; 1 ms (1 %) is not; a real rank's None is no figure."""
    import dataclasses
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(dataclasses.replace(_spec(), workload="replay", workload_options={"trace": "/t.json", "compute": "sleep"}), {})
    for step in range(3):
        rec.step(0, step, step_s=0.1, behind_s=late)
        rec.step(1, step, step_s=0.09, behind_s=None if late is None else late / 5)
    s = results.summarize(rec.conn, results.find_run(rec.conn, "r1"))
    assert (s.median_behind_s, s.host_behind) == (late, flagged)


def test_a_steps_first_bucket_is_ready_when_its_latest_rank_has_one(tmp_path):
    """No exchange of a step can start before every rank has its first bucket: per step the latest
    rank's earliest ready_s, the median over steps 1 on (step 0 left out), in emulated seconds.
    Worked by hand: steps 1-3 give 0.3, 0.5 and 0.4 s, median 0.4 s, / K = 4: 0.1 s (planted:
    the earliest rank's gives 0.05, step 0 counted 0.1125, host seconds 0.4)."""
    import dataclasses
    ready = {0: ([0.9, 0.8], [0.7, 0.95]), 1: ([0.4, 0.2], [0.3, 0.6]), 2: ([0.5, 0.6], [0.1, 0.9]),
             3: ([0.2, 0.25], [0.45, 0.4])}          # step: (rank 0's two buckets, rank 1's)
    rec = results.Recorder(str(tmp_path), "r1")
    rec.start_run(dataclasses.replace(_spec(), steps=4, dilate=4.0, workload="replay",
                                      workload_options={"trace": "t.json.gz", "scale": 4, "compute": "sleep"}), {})
    for step, ranks in ready.items():
        for rank, times in enumerate(ranks):
            rec.step(rank, step, exchanges=[_exchange(seq=i, bucket=i, ready_s=t, start_s=t, done_s=t + 0.1, payloads=None)
                                            for i, t in enumerate(times)],
                     layouts=[{"layout": 0, "params": [["module.w", [10]]]}] if step == 0 else [],
                     step_s=1.0, compute_s=0.5)
    rec.finish_run("ok")
    s = results.summarize(rec.conn, results.find_run(rec.conn, "r1"))
    assert s.median_first_ready_s == pytest.approx(0.1)
