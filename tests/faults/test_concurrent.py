"""Two runs at once, in one results directory and in two: distinct names and subnets, every row
where it belongs, private ledgers and stores."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time

import pytest

from helpers import SMALL, leftovers, start

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _run(results_dir, steps="6"):
    return start("run", "--nodes", "2", "--bw", "1gbit", "--workload", SMALL, "--steps", steps, "--no-calibrate",
                 "--results", str(results_dir))


def test_two_runs_at_once_share_nothing_but_the_store(tmp_path, state_dir):
    shared, other = tmp_path / "shared", tmp_path / "other"
    procs = [_run(shared), _run(shared), _run(other)]
    subnets, modes = set(), set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(subnets) < 3:       # look at the live ledgers
        for name in os.listdir(state_dir) if state_dir.exists() else []:
            if name.endswith(".json"):
                with open(state_dir / name) as f:
                    subnets.add(json.load(f)["subnet"])
                modes.add(stat.S_IMODE(os.stat(state_dir / name).st_mode))
        time.sleep(0.1)
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    assert len(subnets) == 3 and modes == {0o600}                 # distinct /24s, ledgers private
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    runs = {}
    for d, expected in ((shared, 2), (other, 1)):
        conn = sqlite3.connect(d / "gctestbed.sqlite")
        assert stat.S_IMODE(os.stat(d / "gctestbed.sqlite").st_mode) == 0o600
        rows = conn.execute("SELECT run_id, status FROM runs").fetchall()
        assert len(rows) == expected and {r[1] for r in rows} == {"ok"}
        for run_id, _ in rows:
            assert stat.S_IMODE(os.stat(d / "runs" / run_id).st_mode) == 0o700      # spec and logs private too
            # each run has exactly its own 2 ranks x 6 steps, and its own node rows
            assert conn.execute("SELECT COUNT(*) FROM steps WHERE run_id=?", (run_id,)).fetchone()[0] == 12
            assert conn.execute("SELECT COUNT(DISTINCT address) FROM nodes WHERE run_id=?", (run_id,)).fetchone()[0] == 2
            runs[run_id] = d
    assert len(runs) == 3
    for run_id in runs:
        assert leftovers(run_id) == []
