"""gctestbed bench scale: one small run per node count, each row the run's own record."""

from __future__ import annotations

import json

import pytest

from helpers import gctestbed, leftovers, show


@pytest.mark.root
@pytest.mark.slow
def test_bench_scale_reports_each_node_count_from_its_run(tmp_path, state_dir):
    proc = gctestbed("bench", "scale", "--nodes", "2,3", "--steps", "3", "--bw", "200mbit", "--json",
                     "--results", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [r["nodes"] for r in report["rows"]] == [2, 3]
    for r in report["rows"]:
        s = show(tmp_path, r["run_id"])
        assert r["status"] == s["status"] == "ok" and s["nodes"] == r["nodes"] and leftovers(r["run_id"]) == []
        assert r["median_step_s"] == s["median_step_s"] and r["busbw_fraction"] > 0.3
        assert 0 < r["fixed_s"] < r["wall_s"] and r["build_s"] < r["fixed_s"]
        # two of the kernel's counters of the node's memory: the share of its pages at the end cannot
        # exceed its peak resident set; a torch process holds more than 50 MB of its own
        assert 50e6 < r["pss_bytes"] <= r["rss_bytes"] < 4e9, r
