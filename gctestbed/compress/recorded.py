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
receives and decodes after an all-gather does (a gathered round decodes one payload per rank):
the decode time of a round that gathered is scaled by world / recorded world. An all-reduced
round's decode (one summed payload) is not.
"""

from __future__ import annotations

from typing import Any

import torch

from ..timing import Waiter
from .base import DESCRIBES, Bucket, Compressor, Payload

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


class RecordedCodec(Compressor):
    """Stands in for ``method`` (its name, collective and options, so the run is labelled and its
    optimizer set up as the method's), sending ``buckets``' recorded payloads: ``buckets`` maps
    (step, DDP's bucket index) to the recorded rank's bucket record (gctestbed.trace's fields)."""

    def __init__(self, method: Compressor, buckets: dict[tuple[int, int], dict[str, Any]], scale: float = 1.0,
                 spin: bool = False, recorded_world: int | None = None):
        self.method = method
        self.options = method.options
        for attr in DESCRIBES:
            setattr(self, attr, getattr(method, attr))
        self.buckets, self.scale, self.recorded_world = buckets, scale, recorded_world
        self.waiter = Waiter(spin)

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
        self.waiter.wait(self.scale * (record.get("encode_s") or 0.0))
        rounds = rounds_of(record)
        return self._payload(rounds, 0, grad, record, bucket.world)

    def _payload(self, rounds, i: int, grad: torch.Tensor, record: dict[str, Any], world: int) -> Payload:
        r = rounds[i]
        return Payload(reduce=[torch.zeros(n, dtype=d) for d, n in r["reduce"]],
                       gather=[torch.zeros(n, dtype=d) for d, n in r["gather"]], sent=record.get("sent"),
                       meta={"round": i, "rounds": rounds, "grad": grad, "record": record, "world": world})

    def decode_seconds(self, record: dict[str, Any], gathered: bool, world: int) -> float:
        """One round's decode wait: the recorded decode time spread over the rounds, scaled by the
        peers for a gathered round (one payload decoded per rank)."""
        share = self.scale * (record.get("decode_s") or 0.0) / max(1, len(rounds_of(record)))
        if gathered and self.recorded_world:
            share *= world / self.recorded_world
        return share

    def decompress(self, payload: Payload, bucket: Bucket, numel: int, out: torch.Tensor | None = None):
        meta = payload.meta
        self.waiter.wait(self.decode_seconds(meta["record"], bool(payload.gather), meta["world"]))
        if meta["round"] + 1 < len(meta["rounds"]):
            return self._payload(meta["rounds"], meta["round"] + 1, meta["grad"], meta["record"], meta["world"])
        return meta["grad"]

    def decode(self, tensors, meta, bucket, numel):       # a replay's payload stands for the gradient it came with
        return meta["grad"]
