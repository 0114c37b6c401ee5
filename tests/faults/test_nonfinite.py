"""NaN or Inf in a gradient: the run stops at that step, naming rank, step and bucket, before any
error-feedback memory takes the values; every earlier step stays recorded."""

from __future__ import annotations

import sqlite3
import textwrap

import pytest
import torch

from gctestbed import runner
from gctestbed.compress import hook
from gctestbed.compress.base import Bucket
from helpers import gctestbed, leftovers, show

POISONED = textwrap.dedent('''
    import torch
    from torch import nn

    def make(rank, world, batch_size, seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
        g = torch.Generator().manual_seed(rank)
        def batches():
            step = 0
            while True:
                x = torch.randn(batch_size, 64, generator=g)
                if rank == 1 and step == 3:
                    x[0, 0] = float("inf")          # one bad sample on one rank
                step += 1
                yield x, (x[:, 1] > 0).long()
        return model, batches(), nn.functional.cross_entropy
''')


def test_check_counts_the_bad_values():
    grad = torch.ones(1000)
    hook.check_finite(grad, Bucket(key=0, shapes=[]))
    grad[[3, 7]] = float("nan")
    grad[9] = float("-inf")
    with pytest.raises(hook.NonFiniteGradient, match="rank 2 step 5 bucket 1: 3 of 1000"):
        hook.check_finite(grad, Bucket(key=1, shapes=[], step=5, rank=2))


class _Exited:
    def __init__(self, code):
        self.code, self.pid = code, -1

    def poll(self):
        return self.code


LOST_PEER = "gctestbed: rank 0 step 3: the gradient exchange failed: Connection closed by peer [10.0.0.2]:4321\n"
SAID_WHY = "step 2\ngctestbed: rank 1 step 3 bucket 0: 1 of 16640 values are NaN or Inf\n"
ABORTED = "terminate called without an active exception\nFatal Python error: Aborted\n"
WARNED = "gctestbed: native kernels unavailable, compressors use their pure-torch reference: no compiler\n"


@pytest.mark.parametrize("logs, codes", [
    ((LOST_PEER, SAID_WHY), (1, 1)),
    ((LOST_PEER, SAID_WHY + ABORTED), (1, -6)),      # node 1's threads wrote after its own line, and aborted it
    ((LOST_PEER + ABORTED, SAID_WHY), (-11, 1)),     # node 0 crashed at exit after losing its peer
    ((LOST_PEER, "step 2\n"), (-11, -9)),            # node 1 killed (a fault), node 0 crashed after it
    ((WARNED + LOST_PEER, WARNED + "step 2\n"), (1, -11)),     # both warned at start; node 1 crashed
], ids=["plain", "cause-aborted-after", "victim-segfaulted", "cause-killed", "warnings-are-not-reasons"])
def test_the_node_that_caused_it_is_blamed_whatever_its_log_ends_with(tmp_path, logs, codes):
    """Node 1 failed; node 0 only lost its peer. Every arrangement here was seen in CI or in a
    fault run: the blame must not turn to node 0."""
    for r, text in enumerate(logs):
        (tmp_path / f"node{r}.log").write_text(text)
    rank, how = runner._blame({r: _Exited(c) for r, c in enumerate(codes)}, dict(enumerate(codes)), str(tmp_path), None)
    assert rank == 1
    if "NaN" in logs[1]:
        assert "rank 1 step 3 bucket 0" in runner._log_tail(str(tmp_path / "node1.log"))


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["overlap", "serial"])
def test_a_poisoned_step_stops_the_run_and_names_it(tmp_path, state_dir, mode):
    (tmp_path / "poisoned.py").write_text(POISONED)
    proc = gctestbed("run", "--nodes", "2", "--bw", "1gbit", "--workload", "poisoned:make", "--compressor", "twobit",
                     "--mode", mode, "--steps", "8", "--no-calibrate", "--results", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 1
    s = show(tmp_path / "r")
    assert s["status"] == "failed"
    assert "node 1" in s["error"] and "rank 1 step 3 bucket 0" in s["error"] and "NaN or Inf" in s["error"]
    conn = sqlite3.connect(tmp_path / "r" / "gctestbed.sqlite")
    assert conn.execute("SELECT MAX(step) FROM steps WHERE rank=1").fetchone()[0] == 2      # steps 0-2 kept
    assert leftovers(s["run_id"]) == []


def test_a_node_that_failed_leaves_at_once_whatever_its_threads_wait_for(tmp_path):
    """A node whose exchange failed ends with its reason as its log's last line and exit code 1
    without waiting for threads still blocked: a Python thread here waits 120 s, the node must be gone within 30 (imports included). A store
    that fails takes the same way out of main. Planted: sys.exit in fail (interpreter shutdown joins
    the thread) -> the timeout; sys.exit in main -> the StoreError case."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}     # this checkout's worker
    code = ("import threading, time\n"
            "threading.Thread(target=time.sleep, args=(120,)).start()\n"
            "from gctestbed import worker\n"
            "worker.fail('gctestbed: rank 1 step 3 bucket 0: 1 of 2 gradient values are NaN or Inf')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 1 and done.stderr.splitlines()[-1].endswith("NaN or Inf"), done.stderr
    store = ("import os, sys, threading, time\n"
             "threading.Thread(target=time.sleep, args=(120,)).start()\n"
             "from gctestbed import results, worker\n"
             "def train(*a):\n"
             "    raise results.StoreError('the disk is full')\n"
             "worker.train = train\n"
             "os.environ.update(RANK='1', WORLD_SIZE='2')\n"
             "from gctestbed.spec import LinkSpec\n"
             "open('spec.json', 'w').write(worker.RunSpec(nodes=2, link=LinkSpec(bw_bps=10**9)).to_json())\n"
             "worker.main(['spec.json'])\n")
    done = subprocess.run([sys.executable, "-c", store], capture_output=True, text=True, timeout=30, cwd=tmp_path, env=env)
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == "gctestbed: rank 1: the disk is full", done.stderr
