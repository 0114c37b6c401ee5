"""The docker launcher: containers of the offline image, shaped like netns nodes, nothing left behind."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import SMALL, gctestbed, leftovers, show

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]


def _containers_of(run_id: str) -> list[str]:
    import docker
    return [c.name for c in docker.from_env().containers.list(all=True, filters={"label": f"gctestbed.run={run_id}"})]


@pytest.fixture(scope="module")
def node_image():
    proc = gctestbed("image", "build", timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_image_build_chooses_offline_without_a_registry(node_image):
    assert "built gctestbed-node:cpu (offline" in node_image


def test_two_containers_on_a_shaped_link(tmp_path, state_dir, node_image):
    proc = gctestbed("run", "--launcher", "docker", "--nodes", "2", "--bw", "100mbit", "--workload", SMALL,
                     "--steps", "6", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    s = show(tmp_path)
    assert s["status"] == "ok" and s["steps_recorded"] == 6 and s["params_identical"] is True
    # the link was measured before training, both ways, within 10 % of 100 Mbit/s
    assert len(s["calibration"]) == 2 and not s["calibration_missed"]
    for c in s["calibration"]:
        assert abs(c["wire_bps"] / 100e6 - 1) <= 0.10, c
    # and training's own bytes crossed it at the link's rate
    assert 0.85 <= s["busbw_fraction_of_link"] <= 1.0
    env = json.loads(_run_row(tmp_path, s["run_id"])["environment"])
    assert env["launcher"] == "docker" and env["shaping"]["offline_image"] is True
    assert leftovers(s["run_id"]) == [] and _containers_of(s["run_id"]) == []


def _run_row(results_dir, run_id):
    import sqlite3
    conn = sqlite3.connect(results_dir / "gctestbed.sqlite")
    conn.row_factory = sqlite3.Row
    return conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()


def test_same_spec_same_step_times_on_netns_and_docker(tmp_path, state_dir, node_image):
    """The acceptance check: a 2-node spec at 100mbit, median step times within 15 %; the record
    says how each started its workers (forked on namespace nodes, an interpreter per container)."""
    medians, workers = {}, {}
    for launcher in ("netns", "docker", "netns", "docker"):
        proc = gctestbed("run", "--launcher", launcher, "--nodes", "2", "--bw", "100mbit", "--workload", SMALL,
                         "--steps", "8", "--no-calibrate", "--results", str(tmp_path / launcher))
        assert proc.returncode == 0, proc.stderr
        s = show(tmp_path / launcher)
        medians.setdefault(launcher, []).append(s["median_step_s"])
        workers.setdefault(launcher, set()).add(s["environment"]["shaping"].get("workers"))
    netns, docker = statistics.median(medians["netns"]), statistics.median(medians["docker"])
    assert abs(docker / netns - 1) <= 0.15, medians
    assert workers == {"netns": {"forked"}, "docker": {"interpreters"}}


def test_a_failed_docker_run_leaves_nothing(tmp_path, state_dir, node_image):
    (tmp_path / "broken.py").write_text("def make(rank, world, batch_size, seed):\n    raise SystemExit(3)\n")
    proc = gctestbed("run", "--launcher", "docker", "--nodes", "2", "--bw", "1gbit", "--workload", "broken:make",
                     "--no-calibrate", "--results", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 1
    s = show(tmp_path / "r")
    assert s["status"] == "failed" and "exited with code 3" in s["error"]
    assert leftovers(s["run_id"]) == [] and _containers_of(s["run_id"]) == []


LONG = ("run", "--launcher", "docker", "--nodes", "2", "--bw", "1gbit", "--workload", SMALL, "--steps", "100000",
        "--no-calibrate")


def _stop(proc, sig):
    import os
    os.killpg(proc.pid, sig)
    try:
        return proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_ctrl_c_removes_the_containers_which_had_net_admin_only(tmp_path, state_dir, node_image):
    import signal
    from helpers import start, wait_for_steps
    proc = start(*LONG, "--results", str(tmp_path))
    run_id = wait_for_steps(tmp_path, 3)["run_id"]
    assert len(_containers_of(run_id)) == 2
    import docker
    for name in _containers_of(run_id):              # the least privilege that lets tc run inside
        host = docker.from_env().containers.get(name).attrs["HostConfig"]
        assert host["CapAdd"] == ["NET_ADMIN"] and not host["Privileged"] and host["NetworkMode"] == "none", host
    _, err = _stop(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    assert leftovers(run_id) == [] and _containers_of(run_id) == []
    assert show(tmp_path, run_id)["status"] == "failed"


def test_clean_removes_what_a_killed_docker_run_left(tmp_path, state_dir, node_image):
    import signal
    from helpers import start, wait_for_steps
    proc = start(*LONG, "--results", str(tmp_path))
    run_id = wait_for_steps(tmp_path, 3)["run_id"]
    _stop(proc, signal.SIGKILL)
    assert len(_containers_of(run_id)) == 2                      # kill -9 left them behind
    clean = gctestbed("clean")
    assert clean.returncode == 0, clean.stderr
    assert f"cleaned run {run_id}" in clean.stdout
    assert leftovers(run_id) == [] and _containers_of(run_id) == []
