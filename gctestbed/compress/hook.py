"""The one adapter that turns any Compressor into a DDP communication hook.

Installed with ``register_comm_hook``, compression runs per bucket as soon as the bucket's
gradients are ready, so it overlaps with the rest of backward exactly as production DDP does,
and any model wrapped in DDP can use it.

Every collective is issued by one driver thread per process, bucket after bucket in the order
DDP hands them over (the same on every rank): collectives are matched across ranks by the order
they are issued, and issuing them from completion callbacks — which run on the backend's own
threads, in whatever order buckets finish — would pair one rank's gather of bucket 0 with
another's of bucket 1. The hook only enqueues and returns a future, so backward goes on. A
single-round method whose payload is only summed keeps its all-reduce asynchronous; anything
that needs a further collective waits for it in the driver, never on a backend thread.

The state object, like PyTorch's PowerSGDState, counts what each step cost: payload bytes, the
bytes the collectives transmit, buckets, encode and decode time, and the span from the first
bucket's collective launch to the last one's completion (the communication time).
"""

import queue
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..timing import now
from . import collectives
from .base import Bucket, Compressor, Payload
from .dense import NoCompression

_PLAIN = NoCompression()      # what buckets under the dense floor use


DENSE_FLOOR = 1024      # buckets with fewer elements go dense: compressing them saves less than it costs


class HookState:
    """A compressor, the process group it talks over, the step, and the counters of a step.

    Decoding runs on the communication thread when a collective completes, so the counters are
    guarded by a lock. The worker sets ``step`` before each step's backward.
    """

    def __init__(self, compressor: Compressor, process_group: dist.ProcessGroup | None = None,
                 dense_floor: int = DENSE_FLOOR):
        self.compressor = compressor
        self.dense_floor = dense_floor
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.step = 0
        self._lock = threading.Lock()
        self._reset()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._drive, name="gctestbed-comm", daemon=True).start()

    def _drive(self) -> None:
        """The driver thread: one bucket at a time, in the order the hook enqueued them."""
        while True:
            future, buffer, ctx = self._jobs.get()
            try:
                _exchange(self, future, buffer, ctx)
            except BaseException as e:  # noqa: BLE001 - handed to DDP, which raises it in backward
                future.set_exception(e)

    def _reset(self) -> None:
        self._stats = {"payload_bytes": 0, "expected_tx_bytes": 0, "buckets": 0, "encode_s": 0.0, "decode_s": 0.0}
        self._comm_start: float | None = None
        self._comm_end: float | None = None

    def take_step_stats(self) -> dict[str, Any]:
        """The counters since the last call (one step), then start afresh."""
        with self._lock:
            stats = dict(self._stats)
            span = (self._comm_end - self._comm_start) if self._comm_start and self._comm_end else None
            stats["comm_s"] = span
            self._reset()
        return stats

    def _count(self, **add: float) -> None:
        with self._lock:
            for key, value in add.items():
                self._stats[key] += value

    def _launched(self, at: float) -> None:
        with self._lock:
            if self._comm_start is None:
                self._comm_start = at

    def _arrived(self, at: float) -> None:
        with self._lock:
            self._comm_end = at if self._comm_end is None else max(self._comm_end, at)


def _finish_round(state: HookState, payload: Payload) -> None:
    """Run the gather part of a payload (the reduce part is already summed) and count its bytes."""
    sent = 0
    if payload.gather:
        payload.gathered, sent = collectives.gather(payload.gather, state.process_group)
    state._count(payload_bytes=payload.nbytes,
                 expected_tx_bytes=collectives.wire_bytes(sum(t.numel() * t.element_size() for t in payload.reduce),
                                                          sent, state.world_size))


def compression_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: hand the bucket to the driver thread; the future completes with the new bucket."""
    future: torch.futures.Future = torch.futures.Future()
    ctx = Bucket(key=bucket.index(), shapes=[p.shape for p in bucket.parameters()], step=state.step,
                 rank=state.rank, world=state.world_size, params=list(bucket.parameters()))
    state._jobs.put((future, bucket.buffer(), ctx))
    return future


def _exchange(state: HookState, future: torch.futures.Future, buffer: torch.Tensor, ctx: Bucket) -> None:
    """Compress, communicate, decompress one bucket (on the driver thread)."""
    numel = buffer.numel()
    compressor = state.compressor if numel >= state.dense_floor else _PLAIN
    t0 = now()
    payload = compressor.encode(buffer.div_(state.world_size), ctx)
    launched = now()
    state._count(encode_s=launched - t0, buckets=1)
    state._launched(launched)
    if compressor.rounds == 1 and not payload.gather:
        # summed only, one round: let the all-reduce run while the driver takes the next bucket
        collectives.allreduce(payload.reduce, state.process_group).then(
            lambda f: _complete(state, future, buffer, ctx, compressor, payload, numel))
        return
    current, decode_s = payload, 0.0
    while True:
        collectives.allreduce(current.reduce, state.process_group).wait()
        _finish_round(state, current)
        state._arrived(now())
        t = now()
        result = compressor.decompress(current, ctx, numel, out=buffer)    # native decoders write in place
        decode_s += now() - t
        if not isinstance(result, Payload):
            break
        current = result
    _deliver(state, future, buffer, result, decode_s)


def _complete(state, future, buffer, ctx, compressor, payload, numel) -> None:
    """Completion of a one-round, summed-only payload (on a backend thread: no collectives here)."""
    try:
        _finish_round(state, payload)
        state._arrived(now())
        t = now()
        result = compressor.decompress(payload, ctx, numel)
        _deliver(state, future, buffer, result, now() - t)
    except BaseException as e:  # noqa: BLE001
        future.set_exception(e)


def _deliver(state: HookState, future: torch.futures.Future, buffer: torch.Tensor, result: torch.Tensor,
             decode_s: float) -> None:
    if result.data_ptr() != buffer.data_ptr():
        buffer.copy_(result)
    state._count(decode_s=decode_s)
    future.set_result(buffer)


def install(model: DistributedDataParallel, compressor: Compressor,
            process_group: dist.ProcessGroup | None = None) -> HookState:
    """Make ``model`` communicate through ``compressor``; returns the state holding the counters."""
    state = HookState(compressor, process_group)
    model.register_comm_hook(state, compression_hook)
    return state
