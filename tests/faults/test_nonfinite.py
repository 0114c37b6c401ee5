"""NaN or Inf in a gradient: the run stops at that step, naming rank, step and bucket, before any
error-feedback memory takes the values; every earlier step stays recorded."""

from __future__ import annotations

import sqlite3
import textwrap

import pytest
import torch

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
