"""--cpus-per-node: every node held to its CPU share by a cgroup, the share recorded, contention shown."""

from __future__ import annotations

import json
import os
import sys

import pytest

from gctestbed import flags, results
from gctestbed.launch import cpushare
from gctestbed.spec import SpecError
from helpers import gctestbed, leftovers, show

needs_cgroup = pytest.mark.skipif(cpushare.hierarchy() is None or os.geteuid() != 0,
                                  reason="needs root and the cgroup cpu controller")

# spins for SECONDS of wall time, then writes the CPU time the kernel charged this process (getrusage):
# a measure of the share that owes nothing to gctestbed's own accounting
BUSY = """
import json, os, resource, sys, time
t0 = time.monotonic()
while time.monotonic() - t0 < {seconds}:
    pass
u = resource.getrusage(resource.RUSAGE_SELF)
wall = time.monotonic() - t0
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({{"cpu_s": u.ru_utime + u.ru_stime, "wall_s": wall}}, f)
"""


def test_the_share_is_checked_with_one_sentence():
    for bad in ("-1", "nan", "0.001", "lots"):
        with pytest.raises(SpecError, match="--cpus-per-node must be a"):
            flags.build_spec(cpus_per_node=bad)
    assert flags.build_spec(cpus_per_node="0.5").cpus_per_node == 0.5
    assert flags.build_spec().cpus_per_node == 0


def test_a_sweep_gives_every_cell_the_share_and_names_itself_apart():
    from gctestbed import sweep
    axes = {axis: [flags.DEFAULTS[axis]] for axis in sweep.AXES}
    plain, capped = sweep.Grid(axes=dict(axes)), sweep.Grid(axes=dict(axes), cpus_per_node="0.5")
    assert [c.spec.cpus_per_node for c in sweep.plan(capped)] == [0.5]
    assert [c.spec.cpus_per_node for c in sweep.plan(plain)] == [0]
    assert capped.default_name() != plain.default_name()


def test_show_says_when_more_nodes_than_cores_ran_uncapped():
    spec = flags.build_spec(nodes="4")
    nodes = [{"rank": r, "cpu_s": 2.0, "wall_s": 8.0, "rss_bytes": None, "pss_bytes": None} for r in range(4)]
    cpu = results._cpu(spec, nodes, {"cpus": 2})
    assert cpu["contended"] and [n["cpu_share"] for n in cpu["nodes"]] == [0.25] * 4
    assert not results._cpu(spec.replace(cpus_per_node=0.5), nodes, {"cpus": 2})["contended"]
    assert not results._cpu(flags.build_spec(nodes="2"), nodes[:2], {"cpus": 2})["contended"]


@needs_cgroup
def test_a_group_holds_its_quota_and_goes_away():
    path = cpushare.create(cpushare.path_of("gct-unit-n0"), 0.25)
    try:
        assert cpushare.quota(path) == pytest.approx(0.25)
        assert cpushare.existing("gct-unit-") == [path]
        assert cpushare.stats(path)["throttled_periods"] == 0
    finally:
        cpushare.remove(path)
    assert cpushare.existing("gct-unit-") == []


@needs_cgroup
@pytest.mark.root
@pytest.mark.slow
def test_cpus_per_node_holds_each_node_to_its_share(tmp_path, state_dir):
    """Two nodes on two cores each spin for 3 s. Uncapped, each gets most of a core; with
    --cpus-per-node 0.25 the kernel charges each about a quarter of its wall time (measured by the
    node's own getrusage, not by gctestbed) and throttles it; the run records the cap; and a run of
    gctestbed's own worker shows each node's CPU time per wall second held to the share with the
    kernel's throttling counters."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY.format(seconds=3.0))

    def shares(*extra: str) -> list[float]:
        out = tmp_path / f"out{len(extra)}"
        out.mkdir()
        proc = gctestbed("run", "--nodes", "2", "--no-calibrate", "--steps", "1", *extra, "--results",
                         str(tmp_path / "r"), "--", sys.executable, str(script), str(out))
        assert proc.returncode == 0, proc.stderr
        got = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
        return [g["cpu_s"] / g["wall_s"] for g in got]

    free = shares()
    assert all(s > 0.6 for s in free), free
    capped = shares("--cpus-per-node", "0.25")
    assert all(0.15 < s < 0.3 for s in capped), capped
    assert show(tmp_path / "r")["cpu"]["cpus_per_node"] == 0.25

    proc = gctestbed("run", "--nodes", "2", "--no-calibrate", "--steps", "6", "--cpus-per-node", "0.3", "--workload",
                     "mlp:width=256,depth=2", "--results", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path / "w")
    for n in s["cpu"]["nodes"]:
        assert 0.15 < n["cpu_share"] < 0.33, s["cpu"]
        kernel = s["cpu"]["cgroups"][str(n["rank"])]
        assert kernel["cpus"] == pytest.approx(0.3) and kernel["throttled_periods"] > kernel["periods"] / 2, kernel
    assert "held to 0.3 CPUs" in gctestbed("show", "--results", str(tmp_path / "w")).stdout
    assert leftovers(s["run_id"]) == []
