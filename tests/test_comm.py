"""--comm: parameter servers as nodes of the network, local SGD and DiLoCo. Bytes are checked
against the interface counters the kernel keeps and against the model's size (2 bits per
element for twobit, 4 bytes per element for a dense pull), never only against the accounting."""

from __future__ import annotations

import os
import signal
import sqlite3

import pytest
import math

import torch

from gctestbed import flags
from gctestbed.comm import ps, wire
from gctestbed.compress.base import Bucket
from gctestbed.spec import SpecError
from helpers import finish, gctestbed, leftovers, show, start, wait_for_steps

MODEL = "mlp:width=256,depth=2,input_dim=64"


@pytest.mark.parametrize("text, says", [
    ("pss", "unknown --comm scheme 'pss'"), ("ps:servers=0", "servers must be from 1 to 32"),
    ("ps:pull=sparse", "pull must be dense or compressed"), ("localsgd:period=0", "period must be 1 or more"),
    ("diloco:outer_lr=-1", "outer_lr above 0"), ("ps:hosts=2", "has no option 'hosts'")])
def test_bad_comm_strings_are_refused_in_one_sentence(text, says):
    """Each refused in one sentence by flags.build_spec, which the CLI prints; the CLI's own exit 2
    and one line are checked once, below (a CLI start each costs some 4 s of importing torch)."""
    with pytest.raises(SpecError) as refused:
        flags.build_spec(comm=text, steps="1")
    assert says in str(refused.value) and len(str(refused.value).strip().splitlines()) == 1, str(refused.value)


def test_a_bad_comm_string_is_one_sentence_and_exit_2_on_the_cli():
    proc = gctestbed("run", "--comm", "pss", "--steps", "1")
    assert proc.returncode == 2 and "unknown --comm scheme 'pss'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("compressor, comm, says", [
    ("powersgd", "ps", "second round"), ("terngrad", "ps", "shared scale"), ("randomk", "ps", "random stream"),
    ("variance", "ps", "statistics"), ("dgc", "ps:pull=compressed", "pull=dense"), ("fp16", "localsgd", "none")])
def test_what_a_scheme_cannot_carry_is_refused_with_a_sentence(compressor, comm, says):
    with pytest.raises(SpecError, match=says):
        flags.build_spec(compressor=compressor, comm=comm)


def test_servers_join_the_network_after_the_workers():
    spec = flags.build_spec(nodes="4", comm="ps:servers=2", compressor="twobit")
    assert (spec.nodes, spec.servers, spec.world, len(spec.network().nodes)) == (4, 2, 6, 6)
    assert spec.role(1) == "node 1" and spec.role(5) == "server 1"


def test_partition_cuts_big_parameters_over_every_server_and_balances_the_rest():
    shapes = [torch.Size(s) for s in [(300, 10), (10,), (50, 4), (7,)]]
    bucket = Bucket(key=0, shapes=shapes, ids=("w", "b", "v", "c"))
    parts = ps.Partition(servers=2, split=1000, place="balanced")(bucket)
    pieces = sorted((p.offset, p.numel) for part in parts for p in part)
    covered = [i for off, n in pieces for i in range(off, off + n)]
    assert covered == list(range(sum(s.numel() for s in shapes)))          # every element once
    cut = [p for part in parts for p in part if isinstance(p.id, tuple)]
    assert sorted(p.id for p in cut) == [("w", "part", 0), ("w", "part", 1)] and all(p.shape == (150, 10) for p in cut)
    loads = [sum(p.numel for p in part) for part in parts]
    assert abs(loads[0] - loads[1]) <= 200                                  # the small ones balance the servers


# MXNet's kvstore (kvstore_dist.h, EncodeDefaultKey), restated by hand: an array of fewer than
# bigarray_bound elements goes whole to server (key * 9973) % K; a bigger one is cut into K
# contiguous flat ranges, range i ending at round(size / K * (i + 1)), half away from zero.
MLP = [("0.weight", (256, 784)), ("0.bias", (256,)), ("2.weight", (10, 256)), ("2.bias", (10,))]


@pytest.mark.parametrize("servers,bound,expected", [
    # bound 1e6: nothing is cut. keys 0..3 * 9973 % 2 = 0, 1, 0, 1
    (2, 1_000_000, [200704 + 2560, 256 + 10]),
    # keys * 9973 % 3 = 0, 1, 2, 0 (9973 = 3 * 3324 + 1)
    (3, 1_000_000, [200704 + 10, 256, 2560]),
    # 9973 % 7 = 5: keys 0..3 go to 0, 5, 10 % 7 = 3, 15 % 7 = 1 (K = 2 and 3 cannot tell key * 9973 from key)
    (7, 1_000_000, [200704, 10, 0, 2560, 0, 256, 0]),
    # bound 1000: 0.weight (200704) and 2.weight (2560) are cut. 200704 / 3 = 66901.33: ends 66901,
    # 133803 (133802.67), 200704; 2560 / 3 = 853.33: ends 853, 1707 (1706.67), 2560. The biases
    # (keys 1 and 3) go to 9973 % 3 = 1 and 29919 % 3 = 0.
    (3, 1000, [66901 + 853 + 10, (133803 - 66901) + (1707 - 853) + 256, (200704 - 133803) + (2560 - 1707)]),
    # 7 elements over 2: 3.5 rounds up to 4 (Python's round would give 4 too; 2.5 below tells them apart)
    (2, 5, None),
])
def test_mxnet_placement_is_mxnets_kvstore_rule(servers, bound, expected):
    model = MLP if expected is not None else [("a", (7,)), ("b", (5,)), ("c", (3,))]
    if expected is None:        # a: 7 / 2 = 3.5 -> ends 4, 7; b: 5 / 2 = 2.5 -> ends 3 (half up), 5; c whole to 2*9973 % 2 = 0
        expected = [4 + 3 + 3, 3 + 2]
    order = [name for name, _ in model]
    bucket = Bucket(key=0, shapes=[torch.Size(s) for _, s in reversed(model)], ids=tuple(reversed(order)))
    parts = ps.Partition(servers, bound, "mxnet", {n: i for i, n in enumerate(order)})(bucket)
    assert [sum(p.numel for p in part) for part in parts] == expected
    pieces = sorted((p.offset, p.numel) for part in parts for p in part)
    assert [i for off, n in pieces for i in range(off, off + n)] == list(range(sum(math.prod(s) for _, s in model)))


def test_a_message_parses_back_to_its_tensors_and_counts_every_byte():
    tensors = [torch.arange(5, dtype=torch.int32), torch.rand(3, dtype=torch.float16), torch.zeros(0)]
    msg = wire.Message(7, 2, tensors, {"plain": False, "shapes": [(5,)]})
    body, header_len = msg.body()
    back = wire.Message.parse(7, 2, header_len, body)
    assert back.info == {"plain": False, "shapes": [(5,)]}
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(tensors, back.tensors))
    assert body.numel() % 8 == 0 and body.numel() >= header_len + 20 + 6


def test_diloco_outer_step_is_the_papers_nesterov_step_on_the_averaged_change(single_rank_group):
    """DiLoCo (Douillard et al. 2023, Algorithm 1): every H inner steps the outer gradient is
    delta = theta_shared - theta_local (averaged over workers; one here), and the outer optimizer
    is SGD with Nesterov momentum: v = mu v + delta, theta_shared -= lr (delta + mu v); every worker
    starts again from theta_shared. The numbers below are worked by hand from those lines."""
    from gctestbed.comm.local import DiLoCo
    spec = flags.build_spec(comm="diloco:inner=2,outer_lr=0.7,outer_momentum=0.9", steps="10")
    p = torch.nn.Parameter(torch.zeros(3))
    diloco = DiLoCo(spec, [p])
    for step, inner_step in enumerate([-1.0, -1.0, -0.5, -0.5]):
        with torch.no_grad():
            p += inner_step                                   # what the inner optimizer did
        diloco.after_step(step)
        if step == 1:   # delta 2, v 2: 0 - 0.7 * (2 + 0.9 * 2)
            assert torch.allclose(p, torch.full((3,), -2.66)), p
        if step == 3:   # delta 1, v 0.9 * 2 + 1 = 2.8: -2.66 - 0.7 * (1 + 0.9 * 2.8)
            assert torch.allclose(p, torch.full((3,), -5.124)), p
        if step == 2:   # between outer steps the local parameters are left alone
            assert torch.allclose(p, torch.full((3,), -3.16)), p


@pytest.mark.root
@pytest.mark.slow
def test_a_dense_parameter_server_trains_bit_for_bit_like_the_ring(tmp_path, kept):
    """With two workers a ring all-reduce adds a + b for every element, as the server does: a run
    through a server must end with the ring's parameters, bit for bit. A server that lost a
    worker's push, or summed the wrong parts, still leaves identical replicas, but not these."""
    digests = {}
    for comm in ("allreduce", "ps:servers=2,split=4096"):
        kept(nodes="2", comm=comm, bw="1gbit", steps="4", workload=MODEL, results_dir=str(tmp_path / comm.split(":")[0]))
        digests[comm] = _rows(tmp_path / comm.split(":")[0], "SELECT DISTINCT param_sha256 FROM nodes WHERE role='worker'")
    assert len(digests["allreduce"]) == 1 and digests["allreduce"] == digests["ps:servers=2,split=4096"], digests


def _rows(path, sql):
    conn = sqlite3.connect(path / "gctestbed.sqlite")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.root
@pytest.mark.slow
def test_parameter_server_twobit_push_is_compressed_and_the_pull_dense_on_the_wire(tmp_path, kept):
    kept(nodes="2", comm="ps:servers=1", bw="200mbit", compressor="twobit", steps="5", workload=MODEL,
         results_dir=str(tmp_path))
    s = show(tmp_path)
    assert s["params_identical"] is True and s["servers"] and "server 0" in s["bottleneck"]
    assert s["busbw_bps"] is None                                          # a ring's figure: not for servers
    numel = _rows(tmp_path, "SELECT SUM(numel) FROM exchanges WHERE rank=0 AND step=4")[0][0]
    assert numel == 256 * 64 + 256 + 256 * 256 + 256 + 10 * 256 + 10      # the mlp, counted by hand
    # steps 2-4 (DDP's start-up broadcast drains in the first two): the kernel's counters
    tx, expected = _rows(tmp_path, "SELECT SUM(tx_bytes), SUM(expected_tx_bytes) FROM steps WHERE step >= 2 AND rank < 2")[0]
    assert 0.9 < tx / expected < 1.1, (tx, expected)
    assert expected / 6 < 1.15 * numel * 2 / 8                             # 2 bits per element, per worker and step
    srv = _rows(tmp_path, "SELECT SUM(rx_bytes), SUM(push_bytes), SUM(tx_bytes), SUM(pull_bytes) FROM server_steps")[0]
    assert 0.9 < srv[0] / srv[1] < 1.1 and 0.9 < srv[2] / srv[3] < 1.1, srv
    assert srv[3] >= 2 * 5 * 4 * numel                                     # dense fp32 sums to both workers


@pytest.mark.root
@pytest.mark.slow
def test_four_workers_two_servers_compressed_pull_share_the_load(tmp_path, kept):
    kept(nodes="4", comm="ps:servers=2,pull=compressed,split=4096", bw="200mbit", compressor="twobit", steps="4",
         workload=MODEL, results_dir=str(tmp_path))
    s = show(tmp_path)
    assert s["params_identical"] is True and s["steps_recorded"] == 4
    pushed = [v["total_push_bytes"] for v in s["servers"]]
    assert min(pushed) > 0.3 * sum(pushed), pushed                        # both servers carry a share
    for v in s["servers"]:                                                 # compressed both ways, on the wire
        assert 0.9 < v["total_tx_bytes"] / v["total_pull_bytes"] < 1.15 and v["total_pull_bytes"] < 1.3 * v["total_push_bytes"]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("comm, averaged", [("localsgd:period=4", {3, 7, 8}), ("diloco:inner=4", {3, 7, 8})])
def test_local_steps_send_nothing_and_the_replicas_end_identical(tmp_path, kept, comm, averaged):
    kept(nodes="2", comm=comm, bw="200mbit", steps="9", workload=MODEL, results_dir=str(tmp_path))
    s = show(tmp_path)
    assert s["params_identical"] is True
    params_bytes = 4 * (256 * 64 + 256 + 256 * 256 + 256 + 10 * 256 + 10)
    # the report compares the mean step over whole periods: steps 4-8, of which 7 and 8 (the last) averaged,
    # each a ring all-reduce of the model
    assert s["amortised"]["steps"] == 5 and s["amortised"]["averaged_share"] == 2 / 5
    assert s["amortised"]["reduce_calls"] == 2 / 5
    assert s["amortised"]["expected_tx_bytes"] == pytest.approx(2 / 5 * params_bytes, rel=0.01)
    tx = dict(_rows(tmp_path, "SELECT step, tx_bytes FROM steps WHERE rank=0 AND step >= 2 ORDER BY step"))
    # An averaging step's queued tail is counted in the next step, so the averaged bytes are judged together
    # (each average is a ring all-reduce of the model: about 1x it), and a local step only where no tail can land.
    total = sum(tx.values())
    assert 0.9 * len(averaged) * params_bytes < total < 1.2 * len(averaged) * params_bytes, tx
    for step, sent in tx.items():
        if step not in averaged and step - 1 not in averaged:
            assert sent < 2000, (step, tx)                                 # nothing but stray ACKs
        elif step not in averaged:
            assert sent < 2000 + 0.3 * params_bytes, (step, tx)            # at most an average's tail


@pytest.mark.root
@pytest.mark.slow
def test_killing_a_server_fails_the_run_naming_it(tmp_path, state_dir):
    proc = start("run", "--nodes", "2", "--comm", "ps:servers=1", "--bw", "1gbit", "--workload", MODEL,
                 "--steps", "100000", "--no-calibrate", "--timeout", "30s", "--results", str(tmp_path))
    ledger = wait_for_steps(tmp_path, 3)
    server = next(o for o in ledger["objects"] if o["kind"] == "process" and o["name"].endswith("-n2"))
    os.kill(server["pid"], signal.SIGKILL)
    _, err = finish(proc)
    assert proc.returncode == 1, err
    assert leftovers(ledger["run_id"]) == []
    s = show(tmp_path, ledger["run_id"])
    assert s["status"] == "failed" and "server 0 (rank 2" in s["error"] and "SIGKILL" in s["error"], s["error"]
    assert s["steps_recorded"] >= 3


@pytest.mark.root
@pytest.mark.slow
def test_a_topology_file_shapes_the_servers_link_on_its_own(tmp_path, kept):
    topo = tmp_path / "slow-server.toml"
    topo.write_text('[defaults]\nbw = "1gbit"\n\n[[nodes]]\ncount = 2\n\n[[nodes]]   # the server: the last node\nbw = "40mbit"\n')
    kept(nodes="2", comm="ps:servers=1", topology_file=str(topo), steps="5", workload=MODEL, results_dir=str(tmp_path))
    s = show(tmp_path)
    assert s["params_identical"] is True and s["bottleneck"].startswith("server 0's"), s["bottleneck"]
    (srv,) = s["servers"]
    # the dense pull leaves through the server's 40 Mbit/s cable: no faster than its rate allows, and
    # the workers, on 1 Gbit/s cables, wait for it (a server shaped like the workers would take 1/25 of it)
    at_rate = srv["median_pull_bytes"] * 8 / 40e6
    assert srv["median_pull_bytes"] >= 2 * 4 * (256 * 64 + 256 + 256 * 256 + 256 + 10 * 256 + 10)
    assert s["median_pull_s"] >= 0.8 * at_rate, (s["median_pull_s"], at_rate)


def test_the_bottleneck_reads_each_workers_own_uplink(tmp_path):
    from gctestbed.results.summary import _ps_bottleneck
    topo = tmp_path / "slow-worker.toml"
    topo.write_text('[defaults]\nbw = "1gbit"\n\n[[nodes]]\n\n[[nodes]]\nbw = "10mbit"\n\n[[nodes]]\n')
    spec = flags.build_spec(nodes="2", comm="ps:servers=1", compressor="twobit", topology_file=str(topo))
    per_step = [[{"rank": 0, "expected_tx_bytes": 100_000}, {"rank": 1, "expected_tx_bytes": 100_000}]]
    server = {"server": 0, "rank": 2, "median_push_bytes": 200_000, "median_pull_bytes": 800_000, "median_sum_s": 0.001}
    # worker 1 pushes 0.1 MB through 10 Mbit/s (80 ms); the server's 1 Gbit/s uplink takes 6.4 ms for its pulls
    assert _ps_bottleneck(spec, per_step, [server]).startswith("worker 1's uplink (pushes, 0.1 MB per step): 0.08 s")


def test_rebuilt_buckets_are_placed_as_if_only_they_counted():
    from gctestbed import contracts
    sizes = {"a": 300, "b": 100, "c": 100, "d": 100}

    def bucket(names):
        return Bucket(key=0, shapes=[torch.Size([sizes[n]]) for n in names], ids=tuple(names))
    part = ps.Partition(servers=2, split=10_000, place="balanced")
    part(bucket("abcd"))                                   # DDP's first step: one bucket of everything
    after = [part(bucket(names)) for names in ("dc", "ba")]  # its rebuilt buckets, in backward's order
    load = [sum(p.numel for b in after for p in b[k]) for k in range(2)]
    assert load == [300, 300], load                        # counting the first bucket's places too: 200 and 400
    layouts = [[[n, [sizes[n]]] for n in names] for names in ("abcd", "dc", "ba")]
    stated = contracts.kvstore_parts(layouts, servers=2, split=10_000, place="balanced")[1:]
    assert [[(k, [list(s) for s in shapes]) for k, shapes in b] for b in stated] == \
        [[(k, [[p.numel] for p in b[k]]) for k in range(2) if b[k]] for b in after]
