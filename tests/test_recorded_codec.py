"""The recorded codec sends what the trace says, through the real hook and collectives.

Golden cases are worked from the trace's fields by hand (how many bytes in which round), and the
waits are held against the wall clock around the step, not against the codec's own timers."""

from __future__ import annotations

import time

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gctestbed.compress import create, hook
from gctestbed.compress.base import Bucket, Compressor, Payload
from gctestbed.compress.recorded import RecordedCodec, decode_times, rounds_of


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


class _Slow(Compressor):
    """A gathering method whose decode costs 10 ms for the bucket plus 5 ms per peer's payload."""
    name, collective, summary = "slow", "allgather", "a decode of known cost"

    def encode(self, grad, bucket):
        return Payload(gather=[torch.zeros(8)])              # 32 bytes, the recorded size below

    def decode(self, tensors, meta, bucket, numel):
        time.sleep(0.005)
        return torch.zeros(numel)

    def decompress(self, payload, bucket, numel, out=None):
        time.sleep(0.010)
        return super().decompress(payload, bucket, numel, out)


def test_a_gathered_decode_is_scaled_by_the_methods_own_law_and_a_summed_one_is_not():
    """Golden case by hand: 10 ms + 5 ms a peer is 20 ms at 2 peers and 50 ms at 8, so a 2-node
    trace's decode replayed at 8 takes 2.5 x (not the 4 x of a decode proportional to the peers:
    planted, that rule fails here). A method that only all-reduces is not scaled at all."""
    slow = _Slow()
    slow.options = None
    codec = RecordedCodec(slow, {}, scale=2.0, recorded_world=2)
    rec = _record(decode_s=0.01, rounds=2, reduce_calls=0, reduce_bytes=0, gather_calls=2, gather_bytes=32)
    bucket = Bucket(key=0, shapes=[torch.Size([100])], world=8)
    assert codec.decode_seconds(rec, bucket) == pytest.approx(2.0 * 0.01 / 2 * 2.5, rel=0.12)
    summed = RecordedCodec(create("none", {}), {}, scale=2.0, recorded_world=2)
    assert summed.decode_seconds(_record(decode_s=0.01, rounds=2), bucket) == 2.0 * 0.01 / 2
    assert codec.decode_seconds(rec, Bucket(key=0, shapes=[torch.Size([100])], world=2)) == 2.0 * 0.01 / 2
    # a stand-in far from the recorded size (100 x here; Strom's absolute τ on a random gradient) times
    # another decode than the trace's: one payload per peer, assumed
    big = _record(decode_s=0.01, rounds=2, reduce_calls=0, reduce_bytes=0, gather_calls=2, gather_bytes=3200)
    assert RecordedCodec(slow, {}, scale=2.0, recorded_world=2).decode_seconds(big, bucket) == 2.0 * 0.01 / 2 * 8 / 2
    # given the trace's shapes and the run's world, every bucket is timed when the codec is made, not in a step
    early = RecordedCodec(slow, {(3, 0): {**rec, "layout": 0}}, recorded_world=2, shapes={0: [[100]]}, world=8)
    assert list(early._peer_scales) == [(0, 8, 1000, 6)]
    # the stand-in's bytes are every round's: TernGrad gathers its 4-byte scale first, its packed codes
    # next (1000 two-bit codes in int32 words: 252 bytes)
    _, tern = decode_times(create("terngrad", {}), Bucket(key=0, shapes=[torch.Size([1000])]), (2,))
    assert tern == 4 + 252
    # variance's encode needs the batch's statistics, so there is nothing to time: one payload per peer
    variance = RecordedCodec(create("variance", {}), {}, scale=2.0, recorded_world=2)
    assert variance.decode_seconds(rec, bucket) == 2.0 * 0.01 / 2 * 8 / 2



def test_a_replay_over_parameter_servers_scales_no_decode_to_its_peers():
    """Over parameter servers the workers decode dense pulls, never the peers' payloads: the codec a
    run makes gets no peer count there, and times nothing; over a ring it gets the run's nodes and
    times each bucket when it is made (planted: the run's nodes given over servers too fails)."""
    from gctestbed import flags
    from gctestbed.compress import recorded
    slow = _Slow()
    slow.options = None
    rec = _record(decode_s=0.01, rounds=2, reduce_calls=0, reduce_bytes=0, gather_calls=2, gather_bytes=32, layout=0)
    codec = {"buckets": {(3, 0): rec}, "recorded_world": 2, "shapes": {0: [[100]]}}
    ring = recorded.for_run(slow, codec, flags.build_spec(nodes="8", calibrate=False))
    assert list(ring._peer_scales) == [(0, 8, 1000, 6)]
    servers = recorded.for_run(slow, codec, flags.build_spec(nodes="8", comm="ps:servers=1", calibrate=False))
    assert servers._peer_scales == {}

@pytest.mark.compiler
def test_decode_time_sees_that_dgc_barely_grows_with_the_peers_and_reference_two_bit_does():
    """From the decodes' structure, not the codec: DGC's native kernel adds every peer's 1 % of
    (index, value) pairs into one dense bucket (the bucket's cost dominates), the reference 2-bit
    unpacks every peer's codes into a whole bucket (each peer costs about a bucket). Planted:
    decode_time timing the encode instead -> both near 1, the 2-bit bound fails."""
    shapes = [torch.Size([1024, 1024])]
    dgc = create("dgc", {"ratio": 0.01, "warmup_epochs": 0}, kernels="native")
    two = create("twobit", {}, kernels="torch")
    ratio = {}
    for name, method in (("dgc", dgc), ("twobit", two)):
        b = Bucket(key=0, shapes=shapes, step=5)
        t, _ = decode_times(method, b, (2, 8))
        ratio[name] = t[8] / t[2]
    assert ratio["twobit"] > 2.5, ratio
    assert ratio["dgc"] < 0.6 * ratio["twobit"], ratio
    # timed on a spare copy: the run's method keeps no memories of the random gradients (DGC's velocity
    # and accumulation would be two models' worth held for the whole run). Planted: timing self.method
    # itself -> its memories fill
    rec = {**_record(numel=1024 * 1024, gather_calls=2, reduce_calls=0, reduce_bytes=0, gather_bytes=8 * 10486,
                     decode_s=0.001, payloads=[{"gather": [["int32", 10486], ["float32", 10486]]}]), "layout": 0}
    run_method = create("dgc", {"ratio": 0.01, "warmup_epochs": 0}, kernels="native")
    codec = RecordedCodec(run_method, {(3, 0): rec}, recorded_world=2, shapes={0: [[1024, 1024]]}, world=8)
    assert len(codec._peer_scales) == 1
    assert not vars(run_method.velocity)["_flats"] and not vars(run_method.accumulated)["_flats"]


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


def _steps(gathered: list[int], dtype: str = "int32") -> list[dict]:
    """One bucket a step, gathering the given element counts (index and value tensors alike)."""
    return [{"step": s, "buckets": [_record(sent=n, reduce_calls=0, reduce_bytes=0, gather_calls=2, gather_bytes=8 * n,
                                            encode_s=0.001 * s, payloads=[{"gather": [[dtype, n], ["float32", n]]}])]}
            for s, n in enumerate(gathered)]


def test_copies_beyond_the_recorded_ranks_send_what_their_rank_sent_at_other_steps_of_its_phase():
    """Golden case by hand: counts 100, 110, 400, 105, 95 (step 2 a denser phase, 4 x). Copy 0 is
    the rank itself; at step 0 copy 1 takes the next alike step (1: 110), copy 2 the one after
    (3: 105, step 2 being 4 x); step 2 has no step within a factor of 2 and keeps its own; times
    stay each step's own. Planted: every copy sending its rank's own payload -> copy 1's step 0
    reads 100, and the padding of more ranks (the largest of four) never shows."""
    from gctestbed.compress.recorded import borrowed
    steps = _steps([100, 110, 400, 105, 95])
    assert borrowed(steps, 0)[(0, 0)]["sent"] == 100
    one, two = borrowed(steps, 1), borrowed(steps, 2)
    assert [one[(s, 0)]["sent"] for s in range(5)] == [110, 105, 400, 95, 100]
    assert [two[(s, 0)]["sent"] for s in range(5)] == [105, 95, 400, 100, 110]
    assert one[(0, 0)]["payloads"] == [{"gather": [["int32", 110], ["float32", 110]]}]
    assert one[(0, 0)]["gather_bytes"] == 880 and one[(0, 0)]["encode_s"] == 0.0
    # a step whose payload has another form (int64 indices) never stands in for this one's
    mixed = _steps([100, 110, 120])
    mixed[1]["buckets"][0]["payloads"][0]["gather"][0][0] = "int64"
    assert borrowed(mixed, 1)[(0, 0)]["sent"] == 120
    # nor one whose all-reduced tensor has another size (every rank must all-reduce the same)
    sized = _steps([100, 110, 120])
    for step, n in ((0, 4), (1, 5), (2, 4)):
        sized[step]["buckets"][0]["payloads"][0]["reduce"] = [["float32", n]]
    assert borrowed(sized, 1)[(0, 0)]["sent"] == 120
