"""Run a compressor on several ranks in one process: the collectives done by hand, exactly."""

from __future__ import annotations

import torch

from gctestbed import compress
from gctestbed.compress.base import Bucket, Payload


def exchange(compressors, grads, shapes=None, step=0, key=0):
    """What every rank's bucket holds after the hook: grads are per rank (already / world)."""
    world = len(grads)
    numel = grads[0].numel()
    shapes = shapes or [torch.Size([numel])]
    buckets = [Bucket(key, shapes, step=step, rank=r, world=world) for r in range(world)]
    payloads = [c.encode(g.clone(), b) for c, g, b in zip(compressors, grads, buckets)]
    sent = [p.nbytes for p in payloads]
    while True:
        _collect(payloads)
        results = [c.decompress(p, b, numel) for c, p, b in zip(compressors, payloads, buckets)]
        if not isinstance(results[0], Payload):
            return results, sent
        payloads = results
        sent = [s + p.nbytes for s, p in zip(sent, payloads)]


def _collect(payloads: list[Payload]) -> None:
    if payloads[0].reduce:
        sums = [sum(p.reduce[i] for p in payloads) for i in range(len(payloads[0].reduce))]
        for p in payloads:
            p.reduce = [s.clone() for s in sums]
    if payloads[0].gather:
        gathered = [[t.clone() for t in p.gather] for p in payloads]
        for p in payloads:
            p.gathered = gathered


def make(name: str, text: str = "", world: int = 1):
    _, options = compress.resolve(name + (f":{text}" if text else ""))
    return [compress.create(name, options) for _ in range(world)]
