"""``gctestbed verify`` on real namespace nodes: all 17 methods keep their contracts, and the check
fails, naming the method and the broken term, on bugs planted in the workers.

A bug is planted with a ``sitecustomize`` module on the workers' PYTHONPATH (the fork server that
forks them starts with the environment verify runs in), so the product code under test is the code
that ships. The first test runs verify as a command of its own, as a user does; the rest invoke the
same command in this process (click's CliRunner: its exit status, stdout and stderr), which spares
each a new interpreter's import of torch and leaves the judging process free of the plant, as it
is of any bug in the workers. The plants of the micro-batch bug and of DGC's 2k share one verify:
each breaks only its own methods' workers (variance's and hybrid's micro-batches; dgc's
sample_sizes), and each test reads its own rows.
"""

from __future__ import annotations

import json
import os

import pytest

from gctestbed import compress, results

from helpers import gctestbed, here

pytestmark = [pytest.mark.root, pytest.mark.slow]

# The micro-batch bug of issue 15: DDP exchanges at every backward (as when a micro-batch's forward
# ran outside no_sync), so variance exchanges its buckets once per micro-batch.
NO_SYNC_IGNORED = """
import contextlib
from torch.nn.parallel import DistributedDataParallel
DistributedDataParallel.no_sync = lambda self: contextlib.nullcontext()
"""
# DGC selecting about 2k elements instead of k.
DGC_TWICE_K = """
from gctestbed.compress import dgc
_sizes = dgc.sample_sizes
def _doubled(n, density, sample_ratio):
    k, sample_n, k_sample = _sizes(n, density, sample_ratio)
    return 2 * k, sample_n, 2 * k_sample
dgc.sample_sizes = _doubled
"""


def verify(tmp_path, *args, plant: str | None = None, in_process: bool = True):
    """``gctestbed verify ARGS --json``, its workers with ``plant`` as their sitecustomize: (what
    ended, with returncode and stderr as a subprocess's, the report or None). In this process
    unless ``in_process`` is False."""
    env = {}
    if plant is not None:
        (tmp_path / "plant").mkdir()
        (tmp_path / "plant" / "sitecustomize.py").write_text(plant)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path / "plant"), os.environ.get("PYTHONPATH")]))
    argv = ["verify", *args, "--json", "--results", str(tmp_path / "results")]
    proc = here(*argv, env=env) if in_process else gctestbed(*argv, env={**os.environ, **env}, timeout=900)
    return proc, json.loads(proc.stdout) if proc.stdout.strip() else None


def test_every_method_keeps_its_contract(tmp_path, state_dir):
    proc, report = verify(tmp_path, in_process=False)
    assert proc.returncode == 0, proc.stderr + json.dumps([r for r in report["methods"] if not r["ok"]], indent=1)
    assert sorted(r["method"].split(":")[0] for r in report["methods"]) == compress.names()
    base = report["none"]
    conn = results.connect(str(tmp_path / "results"))
    none_summary = results.summarize(conn, results.find_run(conn, base["run_id"]))
    for row in report["methods"]:
        assert row["ok"] and row["params_identical"] is True, row
        # one exchange per bucket and step, as none makes: each parameter went out once
        assert row["exchanges_per_step"] == base["exchanges_per_step"] >= 2, row
        summary = results.summarize(conn, results.find_run(conn, row["run_id"]))
        assert summary.buckets_per_step == none_summary.buckets_per_step, row["method"]
        assert row["steps_judged"] == list(range(2, row["steps"]))
        assert all(p["steps_judged"] for p in row["phases"]), row["phases"]      # every phase judged
    dgc, powersgd = ({r["method"].split(":")[0]: r for r in report["methods"]}[m] for m in ("dgc", "powersgd"))
    assert len(dgc["phases"]) == 5 and len(powersgd["phases"]) == 2
    conn.close()


@pytest.fixture(scope="module")
def ring_plants(tmp_path_factory, module_ledgers):
    """One verify of variance's and hybrid's micro-batch estimates and of dgc, with the micro-batch
    bug and DGC's 2k planted together: no_sync is entered only by a method that splits its batch
    (worker.forward_backward; dgc and none run one backward outside it), and sample_sizes is dgc's
    alone. (what ended, the report)."""
    return verify(tmp_path_factory.mktemp("ring-plants"),
                  "--compressor", "variance:estimate=microbatch;hybrid:estimate=microbatch;dgc",
                  plant=NO_SYNC_IGNORED + DGC_TWICE_K)


def test_verify_fails_on_the_micro_batch_bug(ring_plants):
    # the micro-batch estimate runs every part but the last inside no_sync (the default, per sample, runs one backward)
    proc, report = ring_plants
    assert proc.returncode == 1, proc.stderr
    assert "broke their contract: variance" in proc.stderr and ", hybrid" in proc.stderr
    rows = [r for r in report["methods"] if r["method"].split(":")[0] in ("variance", "hybrid")]
    assert len(rows) == 2, report["methods"]
    for row in rows:
        terms = {p["term"] for p in row["problems"]}
        assert {"exchanges", "interface bytes"} <= terms, row["problems"]
        assert row["exchanges_per_step"] == 4 * report["none"]["exchanges_per_step"]


def test_verify_fails_on_a_dgc_that_selects_twice_k(ring_plants):
    proc, report = ring_plants
    assert proc.returncode == 1 and "broke their contract: " in proc.stderr, proc.stderr
    assert "dgc:steps_per_epoch=3" in proc.stderr.split("broke their contract: ")[1].strip().split(", "), proc.stderr
    (row,) = [r for r in report["methods"] if r["method"].split(":")[0] == "dgc"]
    assert row["method"] == "dgc:steps_per_epoch=3"
    assert {p["term"] for p in row["problems"]} == {"elements selected"}, row["problems"]
    assert report["none"]["ok"]


# The plants of issue 27: DGC at twice its final density once warmed up; PowerSGD at rank + 1.
# Both touch only the phases a method reaches after its default schedule's first 8 steps.
LATER_PHASES_BROKEN = """
from gctestbed.compress import dgc, lowrank
_density = dgc.DGC.density
def _doubled(self, step):
    d = _density(self, step)
    return 2 * d if d == self.options.ratio else d
dgc.DGC.density = _doubled
_init = lowrank.PowerSGD.__init__
def _rank_up(self, **options):
    _init(self, **options)
    self.options.rank += 1
lowrank.PowerSGD.__init__ = _rank_up
"""


def test_verify_judges_every_phase_of_methods_typed_without_options(tmp_path, state_dir):
    proc, report = verify(tmp_path, "--compressor", "dgc;powersgd", plant=LATER_PHASES_BROKEN)
    assert proc.returncode == 1 and "broke their contract: dgc:steps_per_epoch=3, powersgd:start_iter=4" in proc.stderr
    dgc, powersgd = report["methods"]
    assert [p["steps_judged"] for p in dgc["phases"]] == [[2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13]]
    assert [p["steps_judged"] for p in powersgd["phases"]] == [[2, 3], [4, 5, 6, 7]]
    # broken where the plants act, and only there: after the warm-up, and on the compressed steps
    assert "elements selected" in {p["term"] for p in dgc["problems"]}, dgc["problems"]
    assert {p["step"] for p in dgc["problems"] if p["step"] is not None} == {12, 13}, dgc["problems"]
    assert "payload" in {p["term"] for p in powersgd["problems"]}, powersgd["problems"]
    assert {p["step"] for p in powersgd["problems"] if p["step"] is not None} == {4, 5, 6, 7}, powersgd["problems"]


# A server that pads every pull with 64 kB the workers never read: its own count of the bytes it
# sent includes them, so only a contract written apart from the code can see it.
SERVER_PADS_PULLS = """
import types
import torch
from gctestbed.comm import server, wire
_send = wire.send
def _padded(msg, dsts):
    if msg.tensors and "reduce" not in msg.info:
        msg = wire.Message(msg.step, msg.layout, [*msg.tensors, torch.zeros(16384)], msg.info)
    return _send(msg, dsts)
server.wire = types.SimpleNamespace(**{**vars(wire), "send": _padded})     # the server's wire, send alone replaced
"""
# Workers that push every small parameter to every server (each server then sums a copy).
SMALL_TO_EVERY_SERVER = """
from gctestbed.comm import ps
_call = ps.Partition.__call__
def _everywhere(self, bucket):
    parts = _call(self, bucket)
    small = [p for part in parts for p in part if not isinstance(p.id, tuple)]
    return [sorted({*part, *small}, key=lambda p: p.offset) for part in parts]
ps.Partition.__call__ = _everywhere
"""


def test_parameter_servers_keep_the_contract_on_both_sides_of_their_links(tmp_path, state_dir):
    proc, report = verify(tmp_path, "--comm", "ps:servers=2", "--compressor", "twobit;topk;dgc")
    assert proc.returncode == 0, proc.stderr + json.dumps([r for r in report["methods"] if not r["ok"]], indent=1)
    for row in [report["none"], *report["methods"]]:
        assert row["ok"] and row["params_identical"] is True, row
        assert row["collectives_per_step"] == 4, row       # one message per part: 2 buckets, each with parameters on both servers
        for side in ("in", "out"):                          # the servers took in every push and sent every sum
            f = row["servers"][side]
            assert 1.0 <= f["counters_bytes"] / f["contract_bytes"] < 1.15, (row["method"], side, f)
# Servers that sum every part but keep no record of it: to verify, servers that summed nothing.
SERVERS_RECORD_NOTHING = """
from gctestbed import results
results.Recorder.server_step = lambda self, *args, **kw: None
"""


@pytest.mark.parametrize("plant, term", [(SERVER_PADS_PULLS, "server interface bytes"),
                                         (SMALL_TO_EVERY_SERVER, "payload"),
                                         (SERVERS_RECORD_NOTHING, "server steps")])
def test_verify_over_servers_fails_on_planted_bugs(tmp_path, state_dir, plant, term):
    proc, report = verify(tmp_path, "--comm", "ps:servers=2", "--compressor", "twobit", plant=plant)
    assert proc.returncode == 1 and "broke their contract" in proc.stderr, proc.stderr
    (row,) = report["methods"]
    assert term in {p["term"] for p in row["problems"]}, row["problems"]
