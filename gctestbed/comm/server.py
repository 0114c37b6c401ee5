"""A parameter server's loop: one process on a server node, started, supervised, killed and
blamed like a worker (the worker module runs it for ranks past the workers).

For every part of every bucket, in the order the workers push them, the server receives one
message from each worker at once, sums them with the method's own ``decompress`` (the summed
reduce part and every worker's gather part, as an all-reduce and an all-gather would have left
them), and sends every worker the same answer: the dense sum, or the sum encoded again by a copy
of the method with no error feedback (``pull=compressed``). It keeps no model: the first message
of each layout names its parameters' shapes. Each step's times, messages and bytes, and the
server's interface counters over the step, go to the store. Under --dilate K its sums take K times
their time on this host (slept), as everything a dilated run replays does.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import compress
from ..compress import hook
from ..compress.base import Bucket
from ..results import Recorder
from ..spec import RunSpec
from ..timing import Waiter, now
from . import wire


def serve(spec: RunSpec, rank: int, recorder: Recorder, counters: Callable[[], tuple[int, int]]) -> None:
    workers = list(range(spec.nodes))
    index = rank - spec.nodes
    compressed = spec.comm_options["pull"] == "compressed"
    method = compress.for_run(spec, feedback=False)
    layouts: dict[int, tuple[list, list]] = {}
    current, stats = None, None
    stretch = Waiter(spin=False)
    tx0, rx0 = counters()

    def flush() -> None:
        nonlocal tx0, rx0
        tx, rx = counters()
        recorder.server_step(rank, current, tx_bytes=tx - tx0, rx_bytes=rx - rx0, **stats)
        tx0, rx0 = tx, rx

    while True:
        t0 = now()
        got = wire.receive(workers)
        t1 = now()
        msgs = [m for m, _ in got]
        if all(m is None for m in msgs):
            break
        if any(m is None for m in msgs) or len({(m.step, m.layout) for m in msgs}) != 1:
            seen = [None if m is None else (m.step, m.layout) for m in msgs]
            raise RuntimeError(f"server {index}: the workers pushed different parts at once (step, layout per worker: {seen})")
        step, layout = msgs[0].step, msgs[0].layout
        if step != current:
            if current is not None:
                flush()
            current = step
            stats = {"sum_s": 0.0, "wait_s": 0.0, "send_s": 0.0, "messages": 0, "push_bytes": 0, "pull_bytes": 0}
        if "shapes" in msgs[0].info:                 # a layout's first message names its parameters (every worker's alike)
            layouts[layout] = (msgs[0].info["shapes"], msgs[0].info["ids"])
        shapes, ids = layouts[layout]
        bucket = Bucket(key=layout, shapes=[torch.Size(s) for s in shapes], step=step, rank=index,
                        world=spec.nodes, ids=tuple(ids))
        numel = sum(b.numel() for b in bucket.shapes)
        codec = hook.PLAIN if msgs[0].info["plain"] else method
        total = codec.decompress(wire.payload(msgs), bucket, numel)
        if compressed:
            reply = wire.Message.carrying(step, layout, codec.encode(total, bucket))
        else:
            reply = wire.Message(step, layout, [total.to(torch.float32)])
        t2 = now()
        if spec.dilate > 1:         # dilated: the sum is this host's work, so it takes K times as long, as every
            stretch.wait((spec.dilate - 1) * (t2 - t1))     # replayed time does: the emulated server sums at this
            t2 = now()                                       # host's speed, not K times faster
        works, pulled = wire.send(reply, workers)
        for work in works:
            work.wait()
        stats["wait_s"] += t1 - t0
        stats["sum_s"] += t2 - t1
        stats["send_s"] += now() - t2
        stats["messages"] += len(msgs)
        stats["push_bytes"] += sum(nbytes for _, nbytes in got)
        stats["pull_bytes"] += pulled
    if current is not None:
        flush()

