"""--cpus-per-node: every node held to its CPU share by a cgroup, the share recorded, contention shown."""

from __future__ import annotations

import json
import os
import sys

import pytest

from gctestbed import flags, results
from gctestbed.results import summary
from gctestbed.launch import cpushare
from gctestbed.spec import SpecError
from helpers import gctestbed, leftovers, show


# spins for SECONDS of wall time, then writes the CPU time the kernel charged this process over the
# spin (getrusage after less getrusage before): a measure of the share that owes nothing to
# gctestbed's own accounting. The interpreter's start (0.09-0.13 s of CPU here) is left out of both
# the CPU time and the wall time; counted in the one and not the other it read 0.28-0.30 for 0.25.
BUSY = """
import json, os, resource, sys, time
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
c0, t0 = cpu(), time.monotonic()
while time.monotonic() - t0 < {seconds}:
    pass
c1, wall = cpu(), time.monotonic() - t0
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({{"cpu_s": c1 - c0, "wall_s": wall}}, f)
"""


def read(path, key: str) -> str:
    with open(os.path.join(path, key)) as f:
        return f.read().strip()


def test_the_v2_files_are_written_and_read_as_the_kernel_documents(tmp_path, monkeypatch):
    """cgroup v2's files, on a stand-in tree (CI's kernel gives the cpu controller to v1, so its
    v2 tree cannot hold a quota): the controller enabled for children with "+cpu" in the root's
    cgroup.subtree_control, the quota as "QUOTA PERIOD" in cpu.max, and cpu.stat's v2 keys
    (nr_periods, nr_throttled, throttled_usec) read back (Documentation/admin-guide/cgroup-v2.rst)."""
    root = tmp_path / "cgroup2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setattr(cpushare, "V1_ROOT", str(tmp_path / "no-v1"))
    monkeypatch.setattr(cpushare, "_cgroup2_mounts", lambda: [str(root)])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cpushare.hierarchy() == ("v2", str(root))
    path = cpushare.create(cpushare.path_of("gct-unit-n0"), 0.25)
    assert path == str(root / "gctestbed-gct-unit-n0")
    assert read(root, "cgroup.subtree_control") == "+cpu"
    assert read(path, "cpu.max") == "2500 10000"    # 0.25 CPUs: a 2 ms quota needs 8 ms; the period floor is 10 ms
    assert cpushare.quota(path) == 0.25
    (root / "gctestbed-gct-unit-n0" / "cpu.stat").write_text(
        "usage_usec 900000\nuser_usec 800000\nsystem_usec 100000\nnr_periods 40\nnr_throttled 30\nthrottled_usec 1500000\n")
    assert cpushare.stats(path) == {"cpus": 0.25, "periods": 40, "throttled_periods": 30, "throttled_s": 1.5}
    (root / "gctestbed-gct-unit-n0" / "cpu.max").write_text("max 100000\n")
    assert cpushare.quota(path) == float("inf")


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
    nodes = [{"rank": r, "cpu_s": 2.0, "wall_s": 8.0, "rss_bytes": None, "pss_bytes": None, "uss_bytes": None}
             for r in range(4)]
    cpu = summary._cpu(spec, nodes, {"cpus": 2})
    assert cpu["contended"] and [n["cpu_share"] for n in cpu["nodes"]] == [0.25] * 4
    assert not summary._cpu(spec.replace(cpus_per_node=0.5), nodes, {"cpus": 2})["contended"]
    assert not summary._cpu(flags.build_spec(nodes="2"), nodes[:2], {"cpus": 2})["contended"]
    assert summary._cpu(flags.build_spec(nodes="2", comm="ps"), nodes[:2], {"cpus": 2})["contended"]   # a server too
    assert cpu["workers_cpus"] == 4 and summary._cpu(spec.replace(cpus_per_node=0.5), nodes, {"cpus": 2})["workers_cpus"] == 2
    from gctestbed.cli import render
    (head, *per_node) = render._cpu_rows(cpu)
    assert head[0] == "CPU contention" and "depend on the scheduler" in head[1] and len(per_node) == 4
    # where a replay's HOST-BOUND row already warns, the row says only the fact, once
    assert render._cpu_rows(cpu, warned=True)[0] == ("CPU contention", "4 nodes shared 2 cores with no --cpus-per-node")


@pytest.mark.root
@pytest.mark.cgroup
@pytest.mark.parametrize("version", [pytest.param("v1", marks=pytest.mark.cgroup_v1),
                                     pytest.param("v2", marks=pytest.mark.cgroup_v2)])
def test_a_group_holds_its_quota_and_goes_away(version):
    """In the kernel's own cgroup tree, of the version this kernel offers (CI's has v1: the other
    skips with that reason); the quota read back from the kernel's files."""
    assert cpushare.hierarchy()[0] == version
    path = cpushare.create(cpushare.path_of("gct-unit-n0"), 0.25)
    try:
        assert cpushare.quota(path) == pytest.approx(0.25)
        period, quota = cpushare.period_quota(0.25)
        if version == "v1":
            assert (read(path, "cpu.cfs_period_us"), read(path, "cpu.cfs_quota_us")) == (str(period), str(quota))
        else:
            assert read(path, "cpu.max") == f"{quota} {period}"
        assert cpushare.existing("gct-unit-") == [path]
        assert cpushare.stats(path)["throttled_periods"] == 0
    finally:
        cpushare.remove(path)
    assert cpushare.existing("gct-unit-") == []


@pytest.mark.root
@pytest.mark.cgroup
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
    assert all(0.15 < s < 0.28 for s in capped), capped   # 0.249-0.250 measured over the spin
    assert show(tmp_path / "r")["cpu"]["cpus_per_node"] == 0.25

    # enough steps that they, not the start, fill the node's life: a forked worker's figures start
    # at its fork, without torch's imports (6 steps of a 256-wide mlp read 0.08-0.15 on a fast host)
    proc = gctestbed("run", "--nodes", "2", "--no-calibrate", "--steps", "20", "--cpus-per-node", "0.3", "--workload",
                     "mlp:width=1024,depth=3", "--results", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path / "w")
    for n in s["cpu"]["nodes"]:
        assert 0.15 < n["cpu_share"] < 0.33, s["cpu"]
        kernel = s["cpu"]["cgroups"][str(n["rank"])]
        assert kernel["cpus"] == pytest.approx(0.3) and kernel["throttled_periods"] > kernel["periods"] / 2, kernel
    assert "held to 0.3 CPUs" in gctestbed("show", "--results", str(tmp_path / "w")).stdout
    assert leftovers(s["run_id"]) == []
