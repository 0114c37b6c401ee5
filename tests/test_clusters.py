"""Beyond one host: gctestbed node under torchrun's rendezvous, compose files, the NCCL check."""

from __future__ import annotations

import pathlib
import sqlite3
import subprocess
import sys

import pytest
import yaml

from gctestbed.launch import compose, nodeenv
from gctestbed.net import shaping
from gctestbed.spec import UserError
from helpers import bare_cluster, gctestbed, show

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_root_compose_file_is_what_the_generator_writes(tmp_path):
    proc = gctestbed("compose", "--nodes", "2", "--gpus", "0,1", "-o", str(tmp_path / "c.yml"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.yml").read_text() == (ROOT / "docker-compose.yml").read_text()


def test_compose_nodes_each_get_their_own_gpu_and_sockets_only():
    data = compose.compose(4, ["3", "2", "1", "0"])
    gpu = [data["services"][f"node{i}"] for i in range(4)]
    assert [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in gpu] == [["3"], ["2"], ["1"], ["0"]]
    assert len({s["environment"]["NCCL_HOSTID"] for s in gpu}) == 4
    for s in gpu:
        assert s["cap_add"] == ["NET_ADMIN"] and "privileged" not in s
        assert s["environment"]["NCCL_NET"] == "Socket" and s["environment"]["NCCL_SHM_DISABLE"] == "1"
        assert "--dev" in s["command"] and "${BW:-1gbit}" in s["command"]
    with pytest.raises(ValueError, match="a GPU of its own"):
        compose.compose(2, ["0", "0"])


@pytest.mark.compose
@pytest.mark.parametrize("nodes", [2, 5])
def test_compose_files_pass_compose_validation(tmp_path, nodes):
    out = tmp_path / "docker-compose.yml"
    assert gctestbed("compose", "--nodes", str(nodes), "-o", str(out)).returncode == 0
    for profile in ("gpu", "cpu"):
        proc = subprocess.run(["docker-compose", "-f", str(out), "--profile", profile, "config"], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", "BW": "100mbit"}, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        resolved = yaml.safe_load(proc.stdout)
        assert "100mbit" in resolved["services"]["node0" if profile == "gpu" else "cpu-node0"]["command"]


def test_nccl_refuses_a_host_without_a_gpu_and_lets_nodes_share_one():
    with pytest.raises(UserError, match="needs a GPU, and torch sees none"):
        nodeenv.check_nccl(2, 0)
    nodeenv.check_nccl(2, 1)          # distinct NCCL_HOSTIDs keep them apart (scripts/gpu-check's nccl step)
    nodeenv.check_nccl(2, 2)


def test_the_docker_launcher_refuses_more_gpu_nodes_than_gpus_before_building_anything(monkeypatch):
    """Its containers get GPU i each, so two nodes on one GPU are refused in one sentence (netns may share)."""
    import torch
    from gctestbed import flags
    from gctestbed.launch import docker

    monkeypatch.setattr(docker.DockerCluster, "check_host", staticmethod(lambda: None))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    spec = flags.build_spec(nodes="2", device="cuda", launcher="docker")
    cluster = docker.DockerCluster(spec, state=None)
    cluster.shaped = None                 # anything built past the check would fail on this
    with pytest.raises(UserError, match="gives node i GPU i, and torch sees 1 for 2 nodes"):
        cluster.up()


def _run_hosts(name: str, count: int, args: list[str], tmp_path) -> None:
    """'gctestbed node ARGS' on each of the cluster's first ``count`` nodes at once, each with its own
    store (tmp_path/hR); every host must finish well, and one that does not in 240 s fails the test
    with every node log, so a hang shows where it was."""
    procs = [subprocess.Popen([sys.executable, "-m", "gctestbed.cli", "exec", name, str(r), "--", "gctestbed", "node",
                               *args, "--results", str(tmp_path / f"h{r}")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(count)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            logs = {str(f): f.read_text()[-3000:] for f in tmp_path.glob("h*/runs/*/*.log")}
            pytest.fail(f"a host did not finish in 240 s; node logs: {logs}")
        assert p.returncode == 0, err


@pytest.mark.root
@pytest.mark.slow
def test_a_parameter_server_host_joins_by_rendezvous_after_the_workers(tmp_path, state_dir):
    """Three 'hosts' run 'gctestbed node --nnodes 2 --comm ps:servers=1': two train, the third (the
    last rank of the rendezvous) serves, and rank 0's store holds the workers' steps and the
    server's, with the servers' contract kept."""
    with bare_cluster(3) as (name, first):
        args = ["--rdzv", f"{first}:29400", "--nnodes", "2", "--comm", "ps:servers=1", "--dev", "eth0", "--bw", "1gbit",
                "--steps", "4", "--no-calibrate", "--run-id", "job1", "--workload", "mlp:width=256,depth=2,input_dim=64"]
        _run_hosts(name, 3, args, tmp_path)
        s = show(tmp_path / "h0", "job1")
    assert s["status"] == "ok" and s["nodes"] == 2 and s["steps_recorded"] == 4 and s["params_identical"] is True
    (srv,) = s["servers"]
    assert srv["rank"] == 2 and srv["steps"] == 4 and srv["total_pull_bytes"] >= 2 * 4 * 4 * 85002   # dense sums
    assert s["contract"]["ok"], s["contract"]["problems"]


@pytest.mark.root
@pytest.mark.slow
def test_two_hosts_by_rendezvous_land_in_rank_0s_store(tmp_path, state_dir):
    """Two 'hosts' (the nodes of a cluster 'up' built, their eth0 handed back unshaped) each run
    'gctestbed node --bw 200mbit': each shapes its NIC, the hosts calibrate their paths, train, and
    rank 0's store holds the whole run with every field a netns run of the same job fills."""
    with bare_cluster(2) as (name, first):
        args = ["--rdzv", f"{first}:29400", "--nnodes", "2", "--dev", "eth0", "--bw", "200mbit", "--steps", "4",
                "--run-id", "job1", "--workload", "mlp:width=256,depth=2,input_dim=64"]
        _run_hosts(name, 2, args, tmp_path)
        conn = sqlite3.connect(tmp_path / "h0" / "gctestbed.sqlite")
        assert conn.execute("SELECT rank, COUNT(*) FROM steps GROUP BY rank").fetchall() == [(0, 4), (1, 4)]
        assert conn.execute("SELECT status FROM runs WHERE run_id='job1'").fetchone() == ("ok",)
        assert len({r[0] for r in conn.execute("SELECT param_sha256 FROM nodes")}) == 1
        hosts = show(tmp_path / "h0", "job1")
    # each path measured by the receiver's goodput: TCP's ~4.6 % of headers under the 200 Mbit/s egress
    paths = {(c["src"], c["dst"]): c for c in hosts["calibration"]}
    assert set(paths) == {(0, 1), (1, 0)} and not hosts["calibration_missed"], hosts["calibration"]
    assert all(0.85 * 200e6 < c["goodput_bps"] < 200e6 and c["rtt_idle_s"] < 0.002 for c in paths.values()), paths
    # the same job as a netns run: every field it fills, the hosts run fills too
    local = gctestbed("run", "--nodes", "2", "--bw", "200mbit", "--steps", "4", "--workload",
                      "mlp:width=256,depth=2,input_dim=64", "--results", str(tmp_path / "netns"))
    assert local.returncode == 0, local.stderr
    netns = show(tmp_path / "netns")

    def filled(summary: dict) -> set[str]:
        return {k for k, v in summary.items() if v not in (None, [], {})}
    assert filled(netns) <= filled(hosts), filled(netns) - filled(hosts)
    assert set(netns["environment"]) <= set(hosts["environment"])
    assert hosts["environment"]["launcher"] == "hosts" and hosts["latency_impl"] == "none"
    assert shaping.link_class(hosts["environment"]["qdisc_stats"]["qdiscs"]["eth0"])["rate_bps"] == 200_000_000
    sent = [shaping.link_class(q)["sent_bytes"] for q in netns["environment"]["qdisc_stats"]["qdiscs"].values()]
    assert sent and all(b > 0 for b in sent)           # every shaped egress, counted before teardown


def test_hosts_calibration_holds_each_path_to_its_senders_link(monkeypatch):
    """launch/hostcal.measure_ring with two hosts as two threads (their Gloo group a stand-in, their
    measurements fakes that say who measured what): each path's target is its sender's rate, its
    RTT both hosts' delays, its loss the sender's --loss in percent, and through that loss what a
    flow of the sender's congestion control carries (by hand below; host 0 runs BBR, held to the
    rate); the goodput is the receiver's. Plants that fail: the receiver's link for the sender's;
    the loss not divided by 100; "cubic" for the sender's congestion control; the receiver's."""
    import threading
    from types import SimpleNamespace
    from gctestbed import flags
    from gctestbed.launch import hostcal
    from gctestbed.net import measure, nic

    mine = threading.local()
    host = {0: dict(addr="10.9.0.1", spec=flags.build_spec(nodes="2", bw="100mbit", latency="5ms", loss="0.5"), cc="bbr"),
            1: dict(addr="10.9.0.2", spec=flags.build_spec(nodes="2", bw="50mbit", latency="10ms", loss="0.5"), cc="reno")}
    meet, slots, windows = threading.Barrier(2, timeout=20), [None, None], {}   # a host that failed frees the other

    def all_gather_object(out, obj, group=None):
        slots[mine.rank] = obj
        meet.wait()
        out[:] = list(slots)
        meet.wait()

    class Sink:
        def __init__(self, ns, addr, warmup_s, port):
            self.addr = addr

        def goodput_bps(self):
            return {"10.9.0.1": 1e6, "10.9.0.2": 2e6}[self.addr]

    def send(ns, peer, window, warmup_s, ifname, port, probe_rtt):
        windows[mine.rank] = window
        return {"10.9.0.2": 99e6, "10.9.0.1": 13e6}[peer], [0.016]

    monkeypatch.setattr(hostcal, "dist", SimpleNamespace(all_gather_object=all_gather_object, barrier=lambda group=None: meet.wait()))
    monkeypatch.setattr(nic, "address", lambda ifname: host[mine.rank]["addr"])
    monkeypatch.setattr(nic, "congestion_control", lambda: host[mine.rank]["cc"])
    monkeypatch.setattr(measure, "Sink", Sink)
    monkeypatch.setattr(measure, "Echo", lambda ns, addr: __import__("contextlib").nullcontext())
    monkeypatch.setattr(measure, "send", send)
    monkeypatch.setattr(hostcal, "_rtts", lambda peer, n, interval_s, first: [0.0152] * n)
    found = {}

    def host_run(rank):
        mine.rank = rank
        found[rank] = hostcal.measure_ring(host[rank]["spec"], rank, 2, "eth0")
    threads = [threading.Thread(target=host_run, args=(r,), daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert found[0] == found[1] and len(found[0]) == 2                  # every host holds the same list
    there, back = found[0]
    assert (there.src, there.dst, back.src, back.dst) == (0, 1, 1, 0)
    assert there.target_rtt_s == back.target_rtt_s == pytest.approx(0.015)   # 5 ms + 10 ms
    assert (there.target_bps, there.loss_limited, windows[0]) == (100_000_000, False, hostcal.SECONDS)   # BBR: the rate
    assert (there.congestion, back.congestion) == ("bbr", "reno")              # each sender's, stored with its path
    assert (there.wire_bps, there.goodput_bps, there.rtt_idle_s) == (99e6, 2e6, 0.0152)
    # back: reno through 0.5 % at the idle 15.2 ms: 17.32 segments of 1514 bytes a round trip,
    # 13.80 Mbit/s, some 5.7 losses a second, so 8.8 s for 50 of them, capped at 8 s
    assert back.loss_limited and back.target_bps == pytest.approx(17.3205 * 1514 * 8 / 0.0152, rel=1e-3)
    assert windows[1] == 8.0 and (back.wire_bps, back.goodput_bps) == (13e6, 1e6)
