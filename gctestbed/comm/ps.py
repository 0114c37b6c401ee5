"""The workers' side of parameter servers: each bucket pushed to the servers, the sum pulled back.

Which server sums which part follows ``ps:place``. ``mxnet`` is MXNet's kvstore rule
(kvstore_dist.h, EncodeDefaultKey): a parameter of fewer than ``split`` (MXNet's bigarray_bound)
elements goes whole to server ``(key * 9973) % servers``, the key being the parameter's index in
the model's parameter order (as MXNet's Module numbers them); a bigger one is cut into ``servers``
contiguous ranges of its flat elements, range i ending at round(numel / servers * (i + 1)).
``balanced`` is gctestbed's own even placement: a big parameter is cut into one block of rows per
server, smaller ones go whole to the least loaded server so far, each parameter counted once (when
DDP rebuilds its buckets after the first step, a parameter placed again first leaves its old
place). Either partition depends only on the buckets' parameters and the model's parameter order,
so every worker cuts the same way, and every server sees the same sequence
of parts from every worker. A part is encoded by the method as a bucket of its own (its
parameters' names and shapes), so error feedback and per-parameter state stay on the worker,
keyed by parameter as always; the server answers with the dense sum or the sum encoded again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..compress import hook
from ..compress.base import Bucket
from ..spec import RunSpec
from ..timing import Span
from . import wire


def mxnet_ranges(key: int, numel: int, servers: int, bound: int) -> list[tuple[int, int, int]]:
    """MXNet's kvstore placement of parameter ``key`` (its index in the model's parameter order):
    (server, first element, end) for each non-empty range. Under ``bound`` elements the array goes
    whole to server (key * 9973) % servers; otherwise server i takes the flat range ending at
    round(numel / servers * (i + 1)), rounded half away from zero as C's std::round does (Python's
    round() would round half to even)."""
    if numel < bound or servers == 1:
        return [((key * 9973) % servers, 0, numel)]
    ends = [math.floor(numel / servers * (i + 1) + 0.5) for i in range(servers)]
    starts = [0] + ends[:-1]
    return [(k, a, b) for k, (a, b) in enumerate(zip(starts, ends)) if b > a]


@dataclass(frozen=True)
class Piece:
    offset: int           # in the bucket's flat buffer
    numel: int
    shape: tuple
    id: object            # the parameter's name, or (name, "part", server) for a block of a cut one


class Partition:
    """Pieces of each bucket per server, cached by the bucket's parameters."""

    def __init__(self, servers: int, split: int, place: str, order: dict | None = None):
        if place == "mxnet" and not order:
            raise ValueError("place=mxnet needs the model's parameter order (MXNet's keys)")
        self.servers, self.split, self.place = servers, split, place
        self.order = order or {}                                   # parameter -> its index in the model
        self.load = [0] * servers
        self.placed: dict[object, list[tuple[int, int]]] = {}     # parameter -> (server, elements) it loads
        self.cache: dict[tuple, list[list[Piece]]] = {}

    def __call__(self, bucket: Bucket) -> list[list[Piece]]:
        key = (bucket.ids, tuple(tuple(s) for s in bucket.shapes))
        if key not in self.cache:
            parts: list[list[Piece]] = [[] for _ in range(self.servers)]
            offset = 0
            for pid, shape in zip(bucket.ids, bucket.shapes):
                n = shape.numel()
                if self.place == "mxnet":
                    ranges = mxnet_ranges(self.order[pid], n, self.servers, self.split)
                    for k, start, stop in ranges:
                        whole = len(ranges) == 1
                        parts[k].append(Piece(offset + start, stop - start, tuple(shape) if whole else (stop - start,),
                                              pid if whole else (pid, "part", k)))
                    offset += n
                    continue
                for k, m in self.placed.pop(pid, []):   # DDP rebuilt its buckets: the parameter's old place is free
                    self.load[k] -= m
                if n >= self.split and self.servers > 1:
                    rows = shape[0] if len(shape) > 1 and shape[0] >= self.servers else n
                    width = n // rows
                    start = 0
                    for k, chunk in enumerate(torch.arange(rows).tensor_split(self.servers)):
                        shp = (len(chunk), *shape[1:]) if rows != n else (len(chunk),)
                        parts[k].append(Piece(offset + start * width, len(chunk) * width, shp, (pid, "part", k)))
                        self.load[k] += len(chunk) * width
                        self.placed.setdefault(pid, []).append((k, len(chunk) * width))
                        start += len(chunk)
                else:
                    k = min(range(self.servers), key=lambda i: (self.load[i], i))
                    parts[k].append(Piece(offset, n, tuple(shape), pid))
                    self.load[k] += n
                    self.placed[pid] = [(k, n)]
                offset += n
            self.cache[key] = parts
        return self.cache[key]


class ServerExchange:
    """``HookState.exchange`` for ``--comm ps``: push every part, pull every sum, write them back."""

    def __init__(self, spec: RunSpec, names: list[str]):
        """``names``: the model's parameters in its order (the buckets' ids), MXNet's keys."""
        self.first, self.servers = spec.nodes, spec.servers
        self.compressed = spec.comm_options["pull"] == "compressed"
        self.partition = Partition(self.servers, spec.comm_options["split"], spec.comm_options["place"],
                                   {name: i for i, name in enumerate(names)})
        self.layouts: list[dict[tuple, int]] = [{} for _ in range(self.servers)]

    def _layout(self, k: int, sub: Bucket) -> tuple[int, dict]:
        """The layout's number on server ``k``, and what to tell the server the first time."""
        key = (sub.ids, tuple(sub.shapes))
        if key in self.layouts[k]:
            return self.layouts[k][key], {}
        self.layouts[k][key] = len(self.layouts[k])
        return self.layouts[k][key], {"shapes": [tuple(s) for s in sub.shapes], "ids": list(sub.ids)}

    def __call__(self, state: hook.HookState, future, buffer: torch.Tensor, ctx: Bucket) -> None:
        numel = buffer.numel()
        hook.check_finite(buffer, ctx)
        method = state.compressor if numel >= state.dense_floor else hook.PLAIN
        buffer.div_(state.world_size)
        t0 = state.moment()
        parts = []
        for k, pieces in enumerate(self.partition(ctx)):
            if not pieces:
                continue
            sub = Bucket(key=ctx.key, shapes=[torch.Size(p.shape) for p in pieces], step=ctx.step, rank=ctx.rank,
                         world=ctx.world, ids=tuple(p.id for p in pieces))
            flat = torch.cat([buffer[p.offset:p.offset + p.numel] for p in pieces])
            parts.append((k, pieces, sub, method.encode(flat, sub)))
        pushed = state.moment()
        encode = Span(t0, pushed)
        state.count(encode_s=encode)
        state.launched(pushed)
        works, push_bytes = [], 0
        for k, pieces, sub, payload in parts:
            layout, first = self._layout(k, sub)
            msg = wire.Message.carrying(ctx.step, layout, payload, {**first, "plain": method is hook.PLAIN})
            w, nbytes = wire.send(msg, [self.first + k])
            works += w
            push_bytes += nbytes
        for w in works:
            w.wait()
        sent = state.moment()
        pulled = wire.receive([self.first + k for k, *_ in parts])
        arrived = state.moment()
        state.arrived(arrived, pushed)
        state.count(push_s=Span(pushed, sent), pull_s=Span(sent, arrived))
        for (k, pieces, sub, _), (msg, _nbytes) in zip(parts, pulled):
            if msg is None or msg.step != ctx.step:
                raise RuntimeError(f"server {k} answered step {ctx.step} bucket {ctx.key} out of turn")
            n = sum(p.numel for p in pieces)
            if self.compressed:
                total = method.decompress(wire.payload([msg]), sub, n)
            else:
                total = msg.tensors[0]
            offset = 0
            for p in pieces:
                buffer[p.offset:p.offset + p.numel] = total[offset:offset + p.numel]
                offset += p.numel
        decode = Span(arrived, state.moment())
        state.count(decode_s=decode)
        payload_bytes = sum(p.nbytes for *_, p in parts)
        gather_bytes = sum(t.numel() * t.element_size() for *_, p in parts for t in p.gather)
        chosen = [p.sent for *_, p in parts if p.sent is not None]
        # one round: every part pushed to its server (the pull is the servers' to send)
        rounds = [{"payload_bytes": payload_bytes, "gather_bytes": gather_bytes, "expected_tx_bytes": push_bytes,
                   "reduce_calls": 0, "gather_calls": 0, "wire": hook.wire_of([p for *_, p in parts])}]
        hook.deliver(state, future, buffer, buffer, 0.0,
                     lambda done: state.record(ctx, numel, sum(chosen) if chosen else None, rounds, encode,
                                               decode, t0.cpu, done))


def goodbye(spec: RunSpec) -> None:
    """Tell every server this worker has no more steps."""
    for work in [w for k in range(spec.servers) for w in wire.bye(spec.nodes + k)]:
        work.wait()
