"""The GPU traces kept in gctestbed/traces/h200 (recorded with NCCL on an NVIDIA H200, docs/replay.md): each
is what it says it is, and its payloads follow each method's own size law, worked by hand from
the sources' rules (DGC's epoch length and selection bounds are gctestbed's own options). The
files are read, not recorded: this guards the kept traces, not the recording."""

from __future__ import annotations

import math
from pathlib import Path

from gctestbed import tracefile

TRACES = Path(__file__).resolve().parent.parent / "gctestbed" / "traces" / "h200"
# the FC-heavy model (mlp:width=1024,depth=3,input_dim=1024): three 1024x1024 layers and a 10-way head
MATRICES = [(1024, 1024)] * 3 + [(10, 1024)]
VECTORS = [1024] * 3 + [10]
N = sum(a * b for a, b in MATRICES) + sum(VECTORS)


def _load(name: str) -> dict:
    return tracefile.load(str(TRACES / name))


def _last_step_payloads(trace: dict) -> list[list[dict]]:
    """Per rank, the payloads (one per round) of the single bucket of the last step."""
    out = []
    for rank in trace["ranks"]:
        (bucket,) = rank["steps"][-1]["buckets"]
        assert bucket["numel"] == N
        out.append(bucket["payloads"])
    return out


def test_every_kept_trace_is_a_two_rank_nccl_trace_from_the_gpu():
    names = sorted(p.name for p in TRACES.glob("*.json.gz"))
    assert names == ["cnn-dgc-1gbit.json.gz", "cnn-none-1gbit.json.gz", "mlp-dgc-1gbit.json.gz",
                     "mlp-fp16-1gbit.json.gz", "mlp-none-1gbit.json.gz", "mlp-powersgd-1gbit.json.gz",
                     "mlp-twobit-1gbit.json.gz", "transformer-dgc-1gbit.json.gz", "transformer-none-1gbit.json.gz"]
    for name in names:
        trace = _load(name)
        workload, method, rate = name.removesuffix(".json.gz").split("-")
        assert trace["recorded"]["device"] == "cuda" and trace["recorded"]["backend"] == "nccl", name
        assert trace["recorded"]["torch"] == "2.11.0", name
        assert trace["job"]["compressor"] == method and trace["job"]["workload"] == workload, name
        assert trace["job"]["bw_bps"] == 1e9 and rate == "1gbit" and trace["job"]["nodes"] == 2, name
        assert [r["rank"] for r in trace["ranks"]] == [0, 1], name
        for rank in trace["ranks"]:
            assert len(rank["steps"]) == 12, name
            for step in rank["steps"]:
                assert step["buckets"] and all(b["ready_s"] is not None and b["encode_s"] is not None
                                               for b in step["buckets"]), name


def test_the_mlp_traces_payloads_follow_each_methods_size_law():
    assert N == 3_159_050
    # none and fp16: every element, in fp32 and fp16
    for ranks, dtype in ((_last_step_payloads(_load("mlp-none-1gbit.json.gz")), "float32"),
                         (_last_step_payloads(_load("mlp-fp16-1gbit.json.gz")), "float16")):
        assert all(p == [{"reduce": [[dtype, N]], "gather": []}] for p in ranks)
    # MXNet's 2-bit: 16 values to a 32-bit word, gathered
    for p in _last_step_payloads(_load("mlp-twobit-1gbit.json.gz")):
        assert p == [{"reduce": [], "gather": [["int32", math.ceil(N / 16)]]}]
    # PowerSGD at rank 2 past its dense start: P = M Q (rows x 2) with the vectors sent whole, then
    # Q = M^T P (columns x 2)
    for p in _last_step_payloads(_load("mlp-powersgd-1gbit.json.gz")):
        assert p == [{"reduce": [["float32", sum(r * 2 for r, _ in MATRICES)], ["float32", sum(VECTORS)]],
                      "gather": []},
                     {"reduce": [["float32", sum(c * 2 for _, c in MATRICES)]], "gather": []}]
    # DGC in its second warm-up epoch (step 11, 10 steps an epoch): 6.25 % of the matrices' elements
    # as indices and values, within the selection's own bounds (0.8 k to 1.3 k); the vectors dense
    k = 0.0625 * sum(a * b for a, b in MATRICES)
    for (p,) in _last_step_payloads(_load("mlp-dgc-1gbit.json.gz")):
        assert p["reduce"] == [["float32", sum(VECTORS)]]
        (idx_type, sent), (val_type, sent_values) = p["gather"]
        assert (idx_type, val_type) == ("int32", "float32") and sent == sent_values
        assert 0.8 * k <= sent <= 1.3 * k, (sent, k)
