"""A replay forms the recorded buckets and releases each when the recorded run's hook got it.

The recorded ready times come from one run's hook; the replayed ones from another run's hook,
measured by that run (the replay's own store), not from the replay workload's schedule. Bytes
are checked on the real method's payload in both runs."""

from __future__ import annotations

import json
import sqlite3
import statistics

import pytest

from gctestbed import tracefile
from helpers import gctestbed

RUN = ("--nodes", "2", "--bw", "1gbit", "--steps", "8", "--no-calibrate", "--bucket-cap-mb", "1", "--batch-size", "256")
WORKLOAD = "mlp:width=1024,depth=3,input_dim=1024"      # 3.2 M parameters: a dozen buckets of about 1 MB


def _ready(results_dir) -> dict[tuple[int, int, int], tuple[float, int]]:
    """(rank, step, seq) -> (ready_s, payload bytes) of the latest run in ``results_dir``."""
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    try:
        run_id = conn.execute("SELECT run_id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        return {(r, s, q): (t, b) for r, s, q, t, b in conn.execute(
            "SELECT rank, step, seq, ready_s, payload_bytes FROM exchanges WHERE run_id=?", (run_id,))}
    finally:
        conn.close()


@pytest.mark.root
def test_a_replay_releases_the_recorded_buckets_at_the_recorded_times(tmp_path, state_dir):
    rec = gctestbed("run", *RUN, "--workload", WORKLOAD, "--results", str(tmp_path / "real"))
    assert rec.returncode == 0, rec.stderr
    path = str(tmp_path / "t.json")
    assert gctestbed("trace", "record", "--results", str(tmp_path / "real"), "-o", path).returncode == 0
    rep = gctestbed("run", *RUN, "--workload", f"replay:trace={path}", "--results", str(tmp_path / "replay"))
    assert rep.returncode == 0, rep.stderr
    trace = tracefile.load(path)
    real, replayed = _ready(tmp_path / "real"), _ready(tmp_path / "replay")
    assert real.keys() == replayed.keys()
    assert all(real[k][1] == replayed[k][1] for k in real)              # the same buckets, the same payloads
    # per rank and bucket (its place in the step), the median ready time over the steps after DDP's first two
    slots = sorted({(r, q) for r, s, q in real if s >= 2})
    assert len(slots) > 2 * 2, "the recorded run exchanged one bucket a step: nothing to order"

    def median_ready(runs, slot):
        return statistics.median(runs[(r, s, q)][0] for r, s, q in runs if (r, q) == slot and s >= 2)
    recorded = {slot: median_ready(real, slot) for slot in slots}
    errors = [abs(median_ready(replayed, slot) - recorded[slot]) for slot in slots]
    spread = max(recorded.values()) - min(recorded.values())
    # released when recorded: every bucket within a fifth of the spread of the recorded ready times
    assert max(errors) <= 0.2 * spread, (errors, spread)
    assert json.loads(json.dumps(trace["job"]))["bucket_cap_mb"] == 1
