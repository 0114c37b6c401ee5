"""The recorded codec sends what the trace says, through the real hook and collectives.

Golden cases are worked from the trace's fields by hand (how many bytes in which round), and the
waits are held against the wall clock around the step, not against the codec's own timers."""

from __future__ import annotations

import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed.compress import create, hook
from gctestbed.compress.recorded import RecordedCodec, rounds_of


def _record(**over):
    base = {"bucket": 0, "numel": 1000, "sent": None, "rounds": 1, "reduce_calls": 1, "gather_calls": 0,
            "reduce_bytes": 4000, "gather_bytes": 0, "encode_s": 0.0, "decode_s": 0.0}
    return {**base, **over}


def test_a_bucket_without_detail_spreads_its_bytes_over_its_collectives():
    # PowerSGD-like: two rounds, one all-reduce each, 1001 bytes in all -> 501 then 500
    two = rounds_of(_record(rounds=2, reduce_calls=2, reduce_bytes=1001))
    assert [[n for _, n in r["reduce"]] for r in two] == [[501], [500]] and all(not r["gather"] for r in two)
    # 2-bit-like: one round, one gather (two all_gather calls: counts, then data) of 252 bytes
    one = rounds_of(_record(reduce_calls=0, reduce_bytes=0, gather_calls=2, gather_bytes=252))
    assert one == [{"reduce": [], "gather": [(torch.uint8, 252)]}]
    # TernGrad-like: a first round that only all-reduces (the scale), a second that gathers the codes
    tern = rounds_of(_record(rounds=2, reduce_calls=1, reduce_bytes=4, gather_calls=2, gather_bytes=250))
    assert tern == [{"reduce": [(torch.uint8, 4)], "gather": []}, {"reduce": [], "gather": [(torch.uint8, 250)]}]


def test_a_bucket_with_detail_is_sent_tensor_for_tensor():
    detail = [{"reduce": [["float16", 10]], "gather": [["int32", 3], ["uint8", 5]]}]
    assert rounds_of(_record(payloads=detail)) == [{"reduce": [(torch.float16, 10)],
                                                      "gather": [(torch.int32, 3), (torch.uint8, 5)]}]


def test_the_hook_sends_the_recorded_payloads_and_waits_the_recorded_times(single_rank_group):
    """Through DDP and the hook in a one-rank Gloo group: the hook's own accounting of each bucket
    (bytes, collectives, rounds) is the trace's, and a step takes at least the recorded encode
    and decode times (wall clock). Planted: bytes halved in rounds_of -> the bytes differ."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(100, 100), bucket_cap_mb=25)          # 10100 elements: one bucket
    rec = _record(numel=10100, rounds=2, reduce_calls=2, reduce_bytes=3000, gather_calls=2, gather_bytes=777,
                  encode_s=0.05, decode_s=0.04)
    codec = RecordedCodec(create("powersgd", {}), {(s, 0): rec for s in range(3)}, recorded_world=1)
    assert codec.name == "powersgd" and codec.rounds == 2
    state = hook.install(model, codec)
    for step in range(3):
        t = time.perf_counter()
        model(torch.randn(4, 100)).sum().backward()
        took = time.perf_counter() - t
        stats = state.take_step_stats()
        ex, = stats["exchanges"]
        assert (ex["payload_bytes"] - ex["gather_bytes"], ex["gather_bytes"]) == (3000, 777), ex
        assert (ex["reduce_calls"], ex["gather_calls"], ex["rounds"]) == (2, 2, 2), ex
        assert 0.05 + 0.04 <= took < 0.05 + 0.04 + 0.08, took     # waited the recorded times, not more


def test_gathered_decode_grows_with_the_peers_and_a_summed_one_does_not():
    codec = RecordedCodec(create("none", {}), {}, scale=2.0, recorded_world=2)
    rec = _record(decode_s=0.01, rounds=2)
    assert codec.decode_seconds(rec, gathered=False, world=8) == 2.0 * 0.01 / 2
    assert codec.decode_seconds(rec, gathered=True, world=8) == 2.0 * 0.01 / 2 * 8 / 2


def test_a_replay_says_how_far_behind_its_trace_the_host_handed_gradients_over():
    """Held against the wall clock around backward: a replay asked to hand its gradient over 100 ms
    into the step waits (0 late, backward at least that long); one whose moment passed before
    backward began (the host busy 80 ms before it) reports lateness within the time it lost.
    Planted: a waiter that reports no lateness -> the late case reads 0."""
    from gctestbed.workloads.replay import ReplayModel
    params = [("module.w", [4])]
    model = ReplayModel(params, [{"module.w": 0.1}] * 2, {"module.w": 0}, "sleep", 1.0, seed=0)
    t = time.perf_counter()
    model(torch.zeros(1)).sum().backward()
    assert time.perf_counter() - t >= 0.1 and model.step_stats()["behind_s"] == 0.0
    model._state.ready[1] = {"module.w": 0.02}
    t = time.perf_counter()
    out = model(torch.zeros(1))
    time.sleep(0.08)                             # the host busy past the recorded moment
    out.sum().backward()
    lost = time.perf_counter() - t - 0.02
    behind = model.step_stats()["behind_s"]
    assert 0.05 <= behind <= lost, (behind, lost)
