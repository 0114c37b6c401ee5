"""A trace's codec, replayed: payloads of the recorded sizes after the recorded encode time.

A replay (workloads/replay.py) with ``codec=recorded`` exchanges, for every bucket, what the
recorded rank put on the wire in that step (the same rounds, collectives, dtypes and element
counts), after waiting the recorded encode time, and after each round waits its share of the
recorded decode time (the bucket's recorded decode time spread evenly over its rounds: the trace
holds it per bucket, not per round). No arithmetic of the method runs, so a GPU's codec is replayed on a CPU host at the GPU's
speed, and the bytes on the wire are the recorded ones whatever the replay's gradients are. The
gradient comes back as it went in (scaled by 1/world by the hook): loss and accuracy of a replay
mean nothing anyway.

Where a trace has no per-round detail (``payloads``, recorded from schema 14), the bucket's
recorded bytes are spread over its recorded collectives: all-reduced bytes evenly over its
all-reduces, issued in the first rounds, and gathered bytes as one byte tensor per gather,
issued in the last rounds. The bytes are the recorded ones; how they split between rounds is
not (PowerSGD's P and Q then carry equal halves).

Node counts other than the recorded one (rank r replays recorded rank r mod p): every rank's
payload is its recorded rank's, so what a rank sends does not grow with the peers, but what it
receives and decodes after an all-gather does, by a law that is the method's own: DGC scatters
each peer's few (index, value) pairs into one dense bucket, so its decode barely grows, while
the reference 2-bit unpacks every peer's codes into a whole bucket, so its decode grows almost
with the peers. The recorded decode time of a bucket that gathers is therefore scaled by the
ratio of the method's own decode of that bucket with ``world`` peers' payloads to its decode with
the recorded world's, timed on this host (``decode_times``); a bucket whose rounds only all-reduce
(one summed payload) is not scaled. For a GPU trace that ratio is this CPU's, an estimate. A
method whose encode needs the batch's statistics (variance, hybrid) has no payload to time without
a batch, and a stand-in more than 2× from the recorded bytes (Strom's absolute τ on a random
gradient sends nearly everything) times another decode than the trace's: their decode is scaled
by world / recorded world, one payload decoded per rank, an assumption.
A method that chooses how much to send (DGC's sampled threshold, Strom's τ) sends a different
amount from each rank, and an all-gather pads every rank's payload to the largest: more ranks,
a larger largest. So the copies beyond the recorded ranks do not all send their recorded rank's
payload of that step, which would cap the largest at the recorded ranks': copy c (ranks cp .. cp
+ p - 1) sends what its recorded rank sent at another step (``borrowed``), keeping that step's
times.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from ..timing import Waiter, now
from .base import DESCRIBES, Bucket, Compressor, Payload, seeded
from ..spec import RunSpec

REPEATS = 5         # timings of a decode, of which the best counts (one descheduled run must not)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
           "bool": torch.bool}


def rounds_of(record: dict[str, Any]) -> list[dict[str, list[tuple[torch.dtype, int]]]]:
    """A recorded bucket's rounds: per round, the (dtype, elements) of each tensor it all-reduced
    and of each it gathered; from the recorded detail, else spread as the module says."""
    if record.get("payloads"):
        return [{part: [(_DTYPES[d], int(n)) for d, n in r.get(part, [])] for part in ("reduce", "gather")}
                for r in record["payloads"]]
    n_rounds = max(1, record["rounds"])
    rounds: list[dict[str, list[tuple[torch.dtype, int]]]] = [{"reduce": [], "gather": []} for _ in range(n_rounds)]
    reduces, reduce_bytes = record["reduce_calls"], record["reduce_bytes"]
    for i in range(reduces):
        share = reduce_bytes // reduces + (1 if i < reduce_bytes % reduces else 0)
        rounds[min(i, n_rounds - 1)]["reduce"].append((torch.uint8, share))
    gathers = record["gather_calls"] // 2          # collectives.GATHER_CALLS per gather: the counts, then the data
    for i in range(gathers):
        share = record["gather_bytes"] // gathers + (1 if i < record["gather_bytes"] % gathers else 0)
        rounds[max(0, n_rounds - gathers + i)]["gather"].append((torch.uint8, share))
    return rounds


def for_run(method: Compressor, codec: dict[str, Any], spec: RunSpec) -> RecordedCodec:
    """The codec a replayed rank of ``spec`` runs in place of ``method`` (``codec``: the replay
    workload's arguments for it). Its decode is scaled to this run's peers over a ring; over
    parameter servers the workers decode dense pulls, never a gathered payload: nothing to scale."""
    return RecordedCodec(method, **codec, world=None if spec.servers else spec.nodes)


class RecordedCodec(Compressor):
    """Stands in for ``method`` (its name, collective and options, so the run is labelled and its
    optimizer set up as the method's), sending ``buckets``' recorded payloads: ``buckets`` maps
    (step, DDP's bucket index) to the recorded rank's bucket record (gctestbed.trace's fields)."""

    def __init__(self, method: Compressor, buckets: dict[tuple[int, int], dict[str, Any]], scale: float = 1.0,
                 spin: bool = False, cpu: bool = False, recorded_world: int | None = None,
                 shapes: dict[int, list[list[int]]] | None = None, world: int | None = None):
        self.method = method
        self.options = method.options
        for attr in DESCRIBES:
            setattr(self, attr, getattr(method, attr))
        self.buckets, self.scale, self.recorded_world = buckets, scale, recorded_world
        self.waiter = Waiter(spin, cpu)        # cpu: the recorded thread CPU seconds are what it spins
        self.encode_key, self.decode_key = ("encode_cpu_s", "decode_cpu_s") if cpu else ("encode_s", "decode_s")
        self._peer_scales: dict[tuple, float] = {}
        if shapes and world:                    # timed now, before the first step, not inside one
            for (step, key), record in buckets.items():
                if record.get("layout") in shapes:
                    self.peer_scale(record, Bucket(key=key, shapes=[torch.Size(x) for x in shapes[record["layout"]]],
                                                   step=step, world=world))

    def _record(self, bucket: Bucket) -> dict[str, Any]:
        try:
            return self.buckets[(bucket.step, bucket.key)]
        except KeyError:
            raise RuntimeError(f"step {bucket.step} bucket {bucket.key} is not in the trace: the replay formed "
                               "buckets the recorded run did not") from None

    def encode(self, grad: torch.Tensor, bucket: Bucket) -> Payload:
        record = self._record(bucket)
        if record["numel"] != grad.numel():
            raise RuntimeError(f"step {bucket.step} bucket {bucket.key} holds {grad.numel()} elements, the trace's "
                               f"{record['numel']}: the replay formed buckets the recorded run did not")
        # the payload made inside the recorded time, not after it: the recorded encode held its making too
        until = self.waiter.clock() + self.scale * (record.get(self.encode_key) or 0.0)
        payload = self._payload(rounds_of(record), 0, grad, record, bucket.world)
        self.waiter.until(until)
        return payload

    def _payload(self, rounds, i: int, grad: torch.Tensor, record: dict[str, Any], world: int) -> Payload:
        r = rounds[i]
        return Payload(reduce=[torch.zeros(n, dtype=d) for d, n in r["reduce"]],
                       gather=[torch.zeros(n, dtype=d) for d, n in r["gather"]], sent=record.get("sent"),
                       meta={"round": i, "rounds": rounds, "grad": grad, "record": record, "world": world})

    def decode_seconds(self, record: dict[str, Any], bucket: Bucket) -> float:
        """One round's decode wait: the recorded decode time spread over the rounds, × how much
        longer the method's decode of this bucket takes with this run's peers than with the
        recorded ones (1 where nothing is gathered or the node count is the recorded one)."""
        return (self.scale * (record.get(self.decode_key) or 0.0) / max(1, len(rounds_of(record)))
                * self.peer_scale(record, bucket))

    def peer_scale(self, record: dict[str, Any], bucket: Bucket) -> float:
        """The method's own decode of ``bucket`` with ``bucket.world`` peers' payloads over its
        decode with the recorded world's, timed once per bucket and payload size (a warm-up that
        changes the density changes it): when the codec is made where it has the trace's shapes,
        else at the bucket's first decode."""
        gathered = _gathered(record)
        if not gathered or not self.recorded_world or bucket.world == self.recorded_world:
            return 1.0
        if self.method.needs_own_loop():        # its encode needs the batch's statistics: nothing to time it on
            return bucket.world / self.recorded_world
        key = (bucket.key, bucket.world, record["numel"], gathered.bit_length())
        if key not in self._peer_scales:
            t, stand_in = decode_times(_spare(self.method), bucket, (self.recorded_world, bucket.world))
            # a stand-in far from the recorded size (Strom's absolute τ on a random gradient sends nearly
            # everything) times another decode than the trace's: one payload decoded per rank, assumed
            recorded = record.get("gather_bytes") or 0
            representative = recorded / 2 <= stand_in <= 2 * recorded
            self._peer_scales[key] = (t[bucket.world] / t[self.recorded_world] if representative
                                      else bucket.world / self.recorded_world)
        return self._peer_scales[key]

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out: torch.Tensor | None = None):
        meta = payload.meta
        self.waiter.wait(self.decode_seconds(meta["record"], bucket))
        if meta["round"] + 1 < len(meta["rounds"]):
            return self._payload(meta["rounds"], meta["round"] + 1, meta["grad"], meta["record"], meta["world"])
        return meta["grad"]

    def decode(self, tensors, meta, bucket, numel):       # a replay's payload stands for the gradient it came with
        return meta["grad"]


def _spare(method: Compressor) -> Compressor:
    """A copy of ``method`` to time, sharing its native kernels: the random gradients fill the
    copy's memories, which go when the timing ends, not the run's method's."""
    ops = getattr(getattr(method, "inner", method), "ops", None)
    return copy.deepcopy(method, {id(ops): ops} if ops is not None else {})


def decode_times(method: Compressor, bucket: Bucket, peers: tuple[int, ...]) -> tuple[dict[int, float], int]:
    """Per peer count, the best of REPEATS timings of ``method``'s decode of ``bucket`` (every
    round, into the bucket's buffer as the hook decodes) when that many ranks' payloads arrive,
    each the one ``method`` encodes here from a random gradient: the collectives are stood in
    for (an all-gather gives that payload once per peer, an all-reduce the payload itself), so
    only the decode's arithmetic is timed. The counts
    alternate, after one untimed round (first allocations), so a slow spell of the host touches
    both. ``method`` is one no run uses (its memories take the random gradients). Also the
    bytes the stand-in payload gathered over every round (the last encode's), to hold against the
    recorded."""
    numel = sum(math.prod(s) for s in bucket.shapes)
    gen = seeded("decode-time", bucket.key)
    buffer = torch.empty(numel)
    best, gathered = {n: math.inf for n in peers}, 0
    for i in range(REPEATS + 1):
        for n in peers:
            at = Bucket(key=bucket.key, shapes=bucket.shapes, step=bucket.step, rank=bucket.rank, world=n,
                        ids=bucket.ids)
            payload = method.encode(buffer.normal_(generator=gen), at)
            gathered, spent = 0, 0.0
            while True:
                gathered += sum(t.numel() * t.element_size() for t in payload.gather)
                payload.gathered = [payload.gather] * n if payload.gather else None
                t = now()
                out = method.decompress(payload, at, numel, out=buffer)   # into the bucket, as the hook does
                spent += now() - t
                if not isinstance(out, Payload):
                    break
                payload = out
            if i:
                best[n] = min(best[n], spent)
    return best, gathered


PAYLOAD_FIELDS = ("sent", "rounds", "reduce_calls", "gather_calls", "reduce_bytes", "gather_bytes", "payloads")


def _form(record: dict[str, Any]) -> tuple:
    """What must match for one step's payload to stand for another's: the bucket, its size, and
    each round's tensors (dtypes, in order; an all-reduced tensor's size too, which every rank
    must share)."""
    return (record["bucket"], record["numel"],
            tuple((tuple(r["reduce"]), tuple(d for d, _ in r["gather"])) for r in rounds_of(record)))


def _gathered(record: dict[str, Any]) -> int:
    return sum(n for r in rounds_of(record) for _, n in r["gather"])


def borrowed(steps: list[dict[str, Any]], copy: int) -> dict[tuple[int, int], dict[str, Any]]:
    """A recorded rank's buckets by (step, bucket index) for its ``copy``-th copy in a replay on
    more nodes (copy 0 is the rank itself: its own records): each bucket's payload (PAYLOAD_FIELDS)
    from the ``copy``-th later step, cyclically, whose payload has the same form and gathers
    within a factor of 2 as many elements (a schedule's phase is not mixed where it changes the
    size more: DGC's warm-up quarters its density each epoch); its times stay the step's own. A
    bucket with no such step keeps its own payload, and where a phase has fewer such steps than
    copies, copies repeat one another's, so the padding grows less than it would for real."""
    own = {(s["step"], b["bucket"]): b for s in steps for b in s["buckets"]}
    if copy == 0:
        return own
    groups: dict[tuple, list[tuple[int, int]]] = {}         # (bucket, form) -> [(step, gathered)], in step order
    for (step, key), record in own.items():
        groups.setdefault(_form(record), []).append((step, _gathered(record)))
    out = {}
    for form, members in groups.items():
        for i, (step, n) in enumerate(members):
            later = members[i + 1:] + members[:i]
            alike = [m for m in later if n / 2 <= m[1] <= 2 * n]
            source = own[(alike[(copy - 1) % len(alike)][0], form[0])] if alike else own[(step, form[0])]
            record = own[(step, form[0])]
            out[(step, form[0])] = {**record, **{f: source[f] for f in PAYLOAD_FIELDS if f in source}}
    return out
