"""The store keeps every step, summarises from rows alone, and is private to its owner."""

from __future__ import annotations

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


def test_unknown_run_is_a_user_error(tmp_path):
    conn = results.connect(str(tmp_path))
    with pytest.raises(UserError, match="no runs yet"):
        results.find_run(conn, None)
    with pytest.raises(UserError, match="no run matches"):
        results.find_run(conn, "zzz")
