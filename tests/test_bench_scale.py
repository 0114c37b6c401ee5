"""gctestbed bench scale: one small run per node count, each row the run's own record."""

from __future__ import annotations

import json

import pytest

from helpers import gctestbed, leftovers, show

# A forked worker's unique memory (USS: the pages only it maps, what its exit would free): measured
# 19.8 to 20.5 MB per node at 2, 3 and 16 nodes (docs/performance.md, "bench scale"), against 229 MB
# for a node with an interpreter of its own. 50 MB leaves 2.5 times the measured figure and is
# under a quarter of a fresh node's: a worker that copied torch's pages instead of sharing them fails.
FORKED_USS_BOUND = 50e6


@pytest.mark.root
@pytest.mark.slow
def test_bench_scale_reports_each_node_count_from_its_run(tmp_path, state_dir):
    proc = gctestbed("bench", "scale", "--nodes", "2,3", "--steps", "3", "--bw", "200mbit", "--json",
                     "--results", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fork_server"] and [r["nodes"] for r in report["rows"]] == [2, 3]
    for r in report["rows"]:
        s = show(tmp_path, r["run_id"])
        assert r["status"] == s["status"] == "ok" and s["nodes"] == r["nodes"] and leftovers(r["run_id"]) == []
        assert r["median_step_s"] == s["median_step_s"] and r["busbw_fraction"] > 0.3
        assert 0 < r["fixed_s"] < r["wall_s"] and r["build_s"] < r["fixed_s"]
        # the kernel's counters of the node's memory, in the order they must have: the pages only it
        # maps, plus its share of the shared ones, within its peak resident set
        assert 0 < r["uss_bytes"] <= r["pss_bytes"] <= r["rss_bytes"] < 4e9, r
        # what the fork server is for: a worker adds little beyond the server's pages it shares
        assert r["uss_bytes"] < FORKED_USS_BOUND, r

    # the same run with an interpreter per node: each node holds torch's pages on its own
    proc = gctestbed("bench", "scale", "--nodes", "2", "--steps", "3", "--bw", "200mbit", "--fresh-nodes", "--json",
                     "--results", str(tmp_path / "fresh"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout)
    assert not fresh["fork_server"] and fresh["rows"][0]["status"] == "ok"
    assert report["rows"][0]["uss_bytes"] < fresh["rows"][0]["uss_bytes"] / 2, (report["rows"][0], fresh["rows"][0])
