"""A trace holds what a run did, checked against what does not come from the trace's code: the
model's parameters counted on the model itself, and twobit's payloads by MXNet's packing rule
(16 two-bit codes to 4 bytes, so a bucket of n elements is ceil(n / 16) * 4 bytes)."""

from __future__ import annotations

import json
import math

import pytest

from gctestbed import tracefile, workloads
from gctestbed.spec import UserError
from helpers import gctestbed

WORKLOAD = "mlp:width=256,depth=2,input_dim=64"
NODES, STEPS = 2, 5


@pytest.mark.root
def test_a_trace_of_a_real_run_holds_its_model_ranks_steps_and_payloads(tmp_path, state_dir):
    run = gctestbed("run", "--nodes", str(NODES), "--bw", "1gbit", "--steps", str(STEPS), "--compressor", "twobit",
                    "--eval-every", "2",
                    "--workload", WORKLOAD, "--no-calibrate", "--results", str(tmp_path / "results"))
    assert run.returncode == 0, run.stderr
    path = str(tmp_path / "run.trace.json.gz")
    rec = gctestbed("trace", "record", "--results", str(tmp_path / "results"), "-o", path)
    assert rec.returncode == 0, rec.stderr
    data = tracefile.load(path)

    model = workloads.build("mlp", {"width": 256, "depth": 2, "input_dim": 64}, seed=0, rank=0, batch_size=8, world=1).model
    assert data["parameters"] == [["module." + n, list(p.shape)] for n, p in model.named_parameters()]
    assert [r["rank"] for r in data["ranks"]] == list(range(NODES))
    for r in data["ranks"]:
        assert [s["step"] for s in r["steps"]] == list(range(STEPS))
        for s in r["steps"]:
            assert s["buckets"] and all(s[k] is not None and s[k] > 0 for k in ("step_s", "compute_s", "encode_s"))
            assert sum(b["numel"] for b in s["buckets"]) == sum(p.numel() for p in model.parameters())
            for b in s["buckets"]:
                assert b["reduce_bytes"] == 0 and b["gather_bytes"] == math.ceil(b["numel"] / 16) * 4, b
                # the hook got the bucket within the step's compute (forward and backward), after it began,
                # the clock not moved by the held-out evaluations between steps (--eval-every)
                assert 0 < b["ready_s"] <= s["compute_s"], (s, b)
                assert b["encode_s"] > 0 and b["decode_s"] > 0, b
            # each bucket's encoding is part of the step's (the step's counter sums the buckets')
            assert sum(b["encode_s"] for b in s["buckets"]) <= s["encode_s"] * 1.0001 + 1e-9, s
    shown = gctestbed("trace", "show", path, "--json")
    assert shown.returncode == 0, shown.stderr
    about = json.loads(shown.stdout)
    assert about["elements"] == sum(p.numel() for p in model.parameters())
    assert [r["bytes"] for r in about["ranks"]] == [math.ceil(about["elements"] / 16) * 4] * NODES


def test_a_file_that_is_not_a_trace_of_this_version_is_refused_in_one_sentence(tmp_path):
    for text, words in (("not json", "cannot read trace"), ('{"a": 1}', "is not a gctestbed trace"),
                        (json.dumps({"format": tracefile.FORMAT, "version": 99}), "version 99 trace")):
        path = tmp_path / "t.json"
        path.write_text(text)
        with pytest.raises(UserError, match=words):
            tracefile.load(str(path))
