"""The results store when the disk is full, the directory read-only, the file locked or truncated:
one clear sentence, and nothing already stored is damaged."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys

import pytest

from gctestbed import results
from gctestbed.spec import LinkSpec, RunSpec
from helpers import SMALL, gctestbed, leftovers, start, wait_for_steps


def _tmpfs(path, size: str, *options: str):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)], check=True)


@pytest.fixture
def mounts():
    made = []
    yield lambda path, size, *options: (_tmpfs(path, size, *options), made.append(path))
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _store_with_rows(results_dir, steps=5) -> str:
    rec = results.Recorder(str(results_dir), "r1")
    rec.start_run(RunSpec(nodes=1, link=LinkSpec(bw_bps=10**9)), {})
    for i in range(steps):
        rec.step(0, i, step_s=0.1, loss=1.0 / (i + 1))
    rec.close()
    return results.db_path(str(results_dir))


def _rows(results_dir) -> list[tuple]:
    conn = results.connect(str(results_dir))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [tuple(r) for r in conn.execute("SELECT run_id, rank, step, step_s, loss FROM steps ORDER BY step")]
    finally:
        conn.close()


def _fill(directory) -> str:
    """Take every free byte of the file system under ``directory``."""
    filler = os.path.join(directory, "filler")
    with open(filler, "wb", buffering=0) as f:     # unbuffered: nothing left to flush (and fail) on close
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError:
            pass
    return filler


@pytest.mark.root
def test_disk_full_is_one_sentence_and_keeps_what_was_stored(tmp_path, mounts):
    mounts(tmp_path / "small", "4m")
    store = tmp_path / "small" / "results"
    _store_with_rows(store)
    before = _rows(store)
    filler = _fill(tmp_path / "small")
    with pytest.raises(results.StoreError) as caught:
        rec = results.Recorder(str(store), "r1")
        try:
            for i in range(5, 5000):             # until a page no longer fits
                rec.step(0, i, step_s=0.1, loss=0.5, payload_bytes=i)
        finally:
            rec.close()
    message = str(caught.value)
    assert "disk is full" in message and "\n" not in message
    with pytest.raises(results.StoreError, match="disk is full"):
        results.check_writable(str(store))       # a run would refuse to start
    os.unlink(filler)
    after = _rows(store)
    assert after[:len(before)] == before         # every row stored before is intact


@pytest.mark.root
@pytest.mark.slow
def test_disk_full_mid_run_fails_cleanly_and_keeps_the_steps(tmp_path, mounts, state_dir):
    mounts(tmp_path / "small", "64m")
    store = tmp_path / "small" / "results"
    proc = start("run", "--nodes", "2", "--bw", "1gbit", "--workload", SMALL, "--steps", "100000", "--no-calibrate",
                 "--results", str(store))
    ledger = wait_for_steps(store, 3)
    filler = _fill(tmp_path / "small")
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (1, 2), err
    errors = [line for line in err.splitlines() if line.startswith("gctestbed:")]
    assert errors and all("disk is full" in e for e in errors) and "Traceback" not in err, err
    os.unlink(filler)
    rows = _rows(store)
    assert len([r for r in rows if r[1] == 0]) >= 3
    # the outcome could not be stored when the run ended; 'clean' records it once there is room
    result = gctestbed("clean")
    assert result.returncode == 0 and ledger["run_id"] in result.stdout, result.stderr
    assert leftovers(ledger["run_id"]) == []
    conn = results.connect(str(store))
    run = conn.execute("SELECT status, error FROM runs").fetchone()
    conn.close()
    assert run["status"] == "failed" and "disk is full" in run["error"], tuple(run)


@pytest.mark.root
def test_a_read_only_results_directory_is_refused_before_anything_is_built(tmp_path, mounts, state_dir):
    mounts(tmp_path / "ro", "1m", "ro")
    result = gctestbed("run", "--nodes", "2", "--steps", "2", "--no-calibrate", "--results", str(tmp_path / "ro" / "r"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("gctestbed:")]
    assert len(errors) == 1 and "not writable" in errors[0], result.stderr
    assert not os.listdir(state_dir) if state_dir.exists() else True     # no ledger: nothing was built
    # nor was one made and undone: the command's early start (a ledger and a fork server) saw the
    # directory could not be written and started nothing
    from gctestbed import runner
    with runner.early_start("netns", (), str(tmp_path / "ro" / "r")) as early:
        assert early is None
    assert not os.listdir(state_dir) if state_dir.exists() else True


def _hold_lock(path: str, seconds: float) -> subprocess.Popen:
    """Another process that takes the store's write lock for ``seconds``; returns once it holds it."""
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2])); c.execute('COMMIT')")
    proc = subprocess.Popen([sys.executable, "-c", code, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_store_locked_too_long_is_one_sentence_and_a_short_lock_is_waited_out(tmp_path, monkeypatch):
    path = _store_with_rows(tmp_path)
    monkeypatch.setattr(results, "BUSY_TIMEOUT_S", 1.0)
    rec = results.Recorder(str(tmp_path), "r1")
    holder = _hold_lock(path, 4)
    with pytest.raises(results.StoreError, match="locked") as caught:
        rec.step(0, 99, step_s=0.1)
    assert "\n" not in str(caught.value)
    holder.wait()
    holder = _hold_lock(path, 0.3)           # a lock held briefly is waited for
    rec.step(0, 100, step_s=0.1)
    holder.wait()
    rec.close()
    steps = [r[2] for r in _rows(tmp_path)]
    assert 100 in steps and 99 not in steps and steps[:5] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_a_truncated_store_is_one_sentence_and_left_as_it_is(tmp_path, state_dir, keep):
    path = _store_with_rows(tmp_path, steps=400)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    for args in (("show", "--results", str(tmp_path)),
                 ("run", "--nodes", "2", "--steps", "2", "--no-calibrate", "--results", str(tmp_path))):
        result = gctestbed(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("gctestbed:")]
        assert len(errors) == 1 and "damaged" in errors[0], result.stderr
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == digest        # we did not write to it
    # the run started early (a ledger and a fork server: the directory can be written) and was
    # refused by the runner's check of the store: both undone by the command itself
    assert [n for n in os.listdir(state_dir) if n.endswith(".json")] == [] and leftovers() == []
